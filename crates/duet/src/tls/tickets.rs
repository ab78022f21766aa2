//! Session resumption by tickets: a client that comes back resumes its session in one round trip,
//! with no certificate signature on duet's side, on whichever worker accepts it. The ticket keys are
//! rustls' [`Ticketer`](rustls::crypto::ring::Ticketer): random, never written anywhere, rotated
//! every 6 hours (a ticket lives at most 12). Acceptors are built again on every reload; the keys
//! are not, so a reload costs clients no full handshake. They are kept per listener, per set of
//! certificates and per way its clients are verified: a resumed session keeps the identities of the
//! handshake that made it, so when a certificate is rotated (perhaps because its key leaked) or
//! `client_auth` or its CA changes, the listener gets new keys, every client sees the new certificate
//! at once, and a session verified under the old rules is never resumed under the new ones (as
//! rustls' docs warn). An OCSP response is not part of it: it is refreshed often, and a resumed
//! session needs no staple.

use duet_config::ListenerTls;
use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex, OnceLock, PoisonError},
};
use tokio_rustls::rustls::{self, server::ProducesTickets};

/// What a listener's tickets may be resumed under: the listener, the certificates it serves and how
/// its clients are verified.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Resumable {
    listener: String,
    /// The content of its certificate and key files and of its client CA, hashed, with whether a
    /// client certificate is required.
    identity: u64,
}

impl Resumable {
    /// The identity of `tls`'s sessions on `listener` (its label), reading the files now. A file
    /// that cannot be read fails the acceptor's build anyway; it hashes as empty here.
    pub(crate) fn of(listener: String, tls: &ListenerTls) -> Self {
        let mut hasher = DefaultHasher::new();
        let read = |path| std::fs::read(path).unwrap_or_default();
        for files in &tls.certificates {
            read(&files.cert).hash(&mut hasher);
            read(&files.key).hash(&mut hasher);
        }
        if let Some(auth) = &tls.client_auth {
            (auth.required, read(&auth.ca)).hash(&mut hasher);
        }
        Self {
            listener,
            identity: hasher.finish(),
        }
    }
}

/// The ticket keys of every listener built since the process started, one per [`Resumable`].
/// Process-wide: the acceptors are built on three threads (start, reload, rotation), each from the
/// config alone.
fn ticketers() -> &'static Mutex<HashMap<Resumable, Arc<dyn ProducesTickets>>> {
    static TICKETERS: OnceLock<Mutex<HashMap<Resumable, Arc<dyn ProducesTickets>>>> =
        OnceLock::new();
    TICKETERS.get_or_init(Mutex::default)
}

/// The ticket keys for `resumable`: the ones it had, or new ones.
pub(crate) fn ticketer(resumable: &Resumable) -> Result<Arc<dyn ProducesTickets>, rustls::Error> {
    // The map holds no invariant a panicking holder could break: a poisoned lock is used as it is.
    let mut ticketers = ticketers().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(ticketer) = ticketers.get(resumable) {
        return Ok(ticketer.clone());
    }
    let ticketer = rustls::crypto::ring::Ticketer::new()?;
    ticketers.insert(resumable.clone(), ticketer.clone());
    Ok(ticketer)
}

/// Forgets the keys of every listener not in `in_use` (removed listeners, old client rules).
pub(crate) fn keep_only(in_use: &[Resumable]) {
    let mut ticketers = ticketers().lock().unwrap_or_else(PoisonError::into_inner);
    ticketers.retain(|resumable, _| in_use.contains(resumable));
}
