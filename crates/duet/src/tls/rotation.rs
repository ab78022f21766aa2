//! Certificate rotation without a signal: the listeners' certificate, key, OCSP and CA files are read once
//! a [`ROTATION_EVERY`] and, when their content changed, every listener's acceptor is built again and
//! handed to the workers. Content, not modification times or inotify, is what is compared, as
//! `--watch` does for the config: a Kubernetes Secret is updated by swapping a symlink, which an
//! inotify watch on the file never sees. Connections already open keep the session they negotiated;
//! a file that does not load (a half-written key, a mismatched pair) keeps the acceptors in use,
//! logged and counted once per content, and the next change is tried again.

use duet_config::Config;
use duet_proxy::{CertificateExpiry, Registry};
use std::{
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
    thread,
    time::Duration,
};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// How often the files are read.
pub(crate) const ROTATION_EVERY: Duration = Duration::from_secs(1);

/// How often the thread looks whether duet is stopping while it waits.
const SHUTDOWN_CHECK: Duration = Duration::from_millis(100);

/// The most of a file read: a certificate chain or key is a few KiB.
const MAX_FILE: u64 = 1 << 20;

/// Each listener's acceptor (`None`: plain), as the workers receive them.
pub(crate) type Acceptors = Arc<Vec<Option<TlsAcceptor>>>;

/// What the rotation thread follows and feeds.
pub(crate) struct Rotation {
    pub(crate) config: watch::Receiver<Arc<Config>>,
    pub(crate) acceptors: Arc<watch::Sender<Acceptors>>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) registry: Registry,
    /// The files' content as the acceptors in use were built from ([`fingerprint`], taken before
    /// they were read, so a change landing in between is seen).
    pub(crate) seen: Vec<u64>,
}

/// Starts the thread; it ends when `shutdown` turns true. Reading a file may block (a FIFO, a hung
/// mount): only this thread waits then, never a worker or the signal loop.
pub(crate) fn spawn(rotation: Rotation) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("duet-tls-rotation".into())
        .spawn(move || run(rotation))
}

fn run(rotation: Rotation) {
    let Rotation {
        config,
        acceptors,
        shutdown,
        registry,
        mut seen,
    } = rotation;
    loop {
        let mut waited = Duration::ZERO;
        while waited < ROTATION_EVERY {
            if *shutdown.borrow() {
                return;
            }
            thread::sleep(SHUTDOWN_CHECK);
            waited += SHUTDOWN_CHECK;
        }
        let current = config.borrow().clone();
        let now = fingerprint(&files(&current));
        if now == seen {
            continue;
        }
        seen = now;
        match build(&current) {
            Ok(built) => {
                acceptors.send_replace(Arc::new(built.acceptors));
                registry.note_certificates(built.certificates);
                registry.note_certificate_rotation(true);
                tracing::info!("listener certificate files changed: new handshakes use them");
            }
            Err(error) => {
                registry.note_certificate_rotation(false);
                tracing::warn!(
                    "listener certificate files changed but do not load ({error}): the certificates \
                     in use stay until the files change again"
                );
            }
        }
    }
}

/// Every listener's acceptor, and the certificates they serve.
#[derive(Default)]
pub(crate) struct Built {
    /// By listener, in config order (`None`: plain).
    pub(crate) acceptors: Vec<Option<TlsAcceptor>>,
    /// What `duet_tls_certificate_expiry_timestamp_seconds` says of them.
    pub(crate) certificates: Vec<CertificateExpiry>,
}

/// Every listener's acceptor, from the files as they are now.
pub(crate) fn build(config: &Config) -> Result<Built, super::TlsError> {
    let mut built = Built::default();
    let mut resumable = Vec::new();
    for listener in &config.listeners {
        let Some(tls) = &listener.tls else {
            built.acceptors.push(None);
            continue;
        };
        let label = duet_proxy::listener_label(listener);
        let tickets = tls
            .session_tickets
            .then(|| super::tickets::Resumable::of(label.clone(), tls));
        let (acceptor, loaded) = super::acceptor(tls, tickets.as_ref())?;
        resumable.extend(tickets);
        built
            .certificates
            .extend(loaded.iter().map(|certificate| CertificateExpiry {
                listener: label.clone(),
                certificate: certificate.files.cert.display().to_string(),
                names: certificate.names.join(","),
                not_after: certificate.not_after,
            }));
        built.acceptors.push(Some(acceptor));
    }
    super::tickets::keep_only(&resumable);
    Ok(built)
}

/// The content of every file `config`'s listeners read for TLS, hashed.
pub(crate) fn fingerprint_of(config: &Config) -> Vec<u64> {
    fingerprint(&files(config))
}

/// Every file the listeners' TLS reads, in config order.
fn files(config: &Config) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for tls in config.listeners.iter().filter_map(|l| l.tls.as_ref()) {
        for files in &tls.certificates {
            paths.push(files.cert.clone());
            paths.push(files.key.clone());
            if let Some((ocsp, _)) = &files.ocsp {
                paths.push(ocsp.clone());
            }
        }
        if let Some(auth) = &tls.client_auth {
            paths.push(auth.ca.clone());
        }
    }
    paths
}

/// The files' contents, hashed (a file that cannot be read counts as empty).
fn fingerprint(paths: &[PathBuf]) -> Vec<u64> {
    paths.iter().map(|path| content_hash(path)).collect()
}

fn content_hash(path: &Path) -> u64 {
    let mut bytes = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|file| file.take(MAX_FILE).read_to_end(&mut bytes));
    read.map_or(0, |_| duet_proxy::config_hash(&bytes))
}
