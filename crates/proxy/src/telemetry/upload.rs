//! How much of a request body the client has sent: what the access log and the upload's own
//! stall detection read.

use crate::telemetry::metrics::ClusterCounters;
use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc,
};

/// Request body bytes received from the client: known at once, or counted while they stream.
#[derive(Debug, Clone)]
pub(crate) enum Received {
    Known(u64),
    Streamed(Arc<Upload>),
}

impl Received {
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Self::Known(bytes) => *bytes,
            Self::Streamed(upload) => upload.bytes(),
        }
    }
}

/// How a streamed upload is going: frames and bytes passed on, and whether it is waiting for the client
/// now.
#[derive(Debug, Default)]
pub(crate) struct Upload {
    pub(crate) frames: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) waiting_for_client: AtomicBool,
    /// The cluster's `duet_request_body_bytes_total`, counted as the bytes pass.
    pub(crate) counters: Option<Arc<ClusterCounters>>,
}

impl Upload {
    /// Body bytes passed to the backend so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Frames passed to the backend so far.
    pub(crate) fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// Whether the upload is held up by the client (whose pace `body_read_timeout` bounds), not by the
    /// backend.
    pub(crate) fn waiting_for_client(&self) -> bool {
        self.waiting_for_client.load(Ordering::Relaxed)
    }
}
