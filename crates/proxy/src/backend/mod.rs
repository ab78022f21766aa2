//! A cluster's backends as one worker sees them: the balancer, the connection pool (plain or TLS),
//! outlier ejection, and the request body each attempt sends; and the health checks' client.

pub(crate) mod cluster;
pub(crate) mod affinity;
pub(crate) mod sticky;
pub(crate) mod probe;

pub(crate) mod outlier;
pub(crate) mod transport;
pub(crate) mod h2_pool;
pub(crate) mod pool;
pub(crate) mod connect;
pub(crate) mod proxy_header;
pub(crate) mod early_answer;
pub(crate) mod tls;
pub(crate) mod request_body;

pub(crate) mod client_body;
