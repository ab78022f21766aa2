//! The stages a request runs through, in order: route, prepare, retry (which runs forward for each
//! attempt), respond. Each knows only what is passed to it (`exchange`) and the layers below.

pub(crate) mod mirror;
pub(crate) mod retry;

pub(crate) mod hedge;
pub(crate) mod hedge_state;

pub(crate) mod forward;
pub(crate) mod prepare;
pub(crate) mod respond;
pub(crate) mod route;
pub(crate) mod route_index;

pub(crate) mod filters;
pub(crate) mod rewrite;
pub(crate) mod split;
