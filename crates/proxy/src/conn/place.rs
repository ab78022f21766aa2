//! What an open connection holds, released when it closes: its place under
//! `limits.max_connections` and, from whoever accepted it, any other (a place under its client's
//! connection cap).

use tokio::sync::OwnedSemaphorePermit;

/// An open connection's places, each given back when the connection closes (when this drops).
/// Opaque to the connection's serving: it is only carried, through parking and resuming alike.
#[derive(Default)]
pub struct Place {
    // Held for what dropping them gives back.
    _permit: Option<OwnedSemaphorePermit>,
    _other: Option<Box<dyn Send + Sync>>,
}

impl Place {
    /// A place under the worker's share of `limits.max_connections`.
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        Self {
            _permit: Some(permit),
            _other: None,
        }
    }

    /// The same, also holding `other` until the connection closes.
    pub fn holding(self, other: impl Send + Sync + 'static) -> Self {
        Self {
            _other: Some(Box::new(other)),
            ..self
        }
    }
}
