//! Client connections: served by hyper with duet's limits, parked while idle, resumed on their next
//! request, turned into tunnels by a `101`, drained at shutdown.

pub(crate) mod accept;
pub(crate) mod connections;
pub(crate) mod serve;
pub(crate) mod shared;

pub(crate) mod parking;

pub(crate) mod active;
pub(crate) mod io;
