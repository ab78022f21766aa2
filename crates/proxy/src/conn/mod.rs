//! Client connections: served by hyper with duet's limits (HTTP/1.1, or HTTP/2 by ALPN or prior
//! knowledge), parked while idle (HTTP/1.1 only), resumed on their next request, turned into tunnels by
//! a `101`, drained at shutdown.

pub(crate) mod accept;
pub(crate) mod connections;
pub(crate) mod http2;
pub(crate) mod serve;
pub(crate) mod shared;

pub(crate) mod parking;

pub(crate) mod active;
pub(crate) mod io;
pub(crate) mod linger;
pub(crate) mod head_timer;
pub(crate) mod proxy_protocol;
pub(crate) mod stream_watch;
pub(crate) mod recycled;
pub(crate) mod place;
pub(crate) mod wakeups;
