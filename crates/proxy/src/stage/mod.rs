//! The stages a request runs through, in order: route, prepare, retry (which sends each attempt with
//! `forward`), respond. Each knows only what is passed to it (`exchange`), the route's filters, which
//! it runs in their phases (`filter`), and the layers below.

pub(crate) mod retry;

pub(crate) mod prepare;
pub(crate) mod respond;
pub(crate) mod route;
pub(crate) mod route_index;
