//! What duet tells about itself: metric cells and their Prometheus text, the status page, the access
//! log.

pub(crate) mod status;

pub(crate) mod history;
pub(crate) mod plot;

pub(crate) mod done;

pub(crate) mod access_log;
pub(crate) mod upload;

pub(crate) mod metrics_families;

pub(crate) mod metrics;

pub(crate) mod route_cells;

pub(crate) mod histogram;

pub(crate) mod process_stats;

pub(crate) mod trace;

pub(crate) mod watch;
