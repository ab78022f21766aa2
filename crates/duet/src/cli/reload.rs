//! Reloading the configuration file on SIGHUP or `--watch`, read on a thread of its own.
//!
//! The loop that waits for signals must never block on the file: a path that became a FIFO, or sits on
//! a hung network mount, would hold SIGHUP's read forever and SIGTERM with it. So each read (the file,
//! then the certificates it names) runs on a short-lived thread; the loop waits for its outcome beside
//! the signals, and gives up on it after [`READ_TIMEOUT`], leaving the thread to its fate (the process
//! exit ends it). At most [`MAX_HUNG`] such threads are left before no new read starts.

use crate::server::{Reload, Server};
use std::{
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::{sync::oneshot, time::Instant};

/// How long a read of the file may take before the reload is given up.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads given up on and still hanging; past it, no new read starts until one returns.
const MAX_HUNG: usize = 3;

/// The most of the file hashed: past duet-config's 16 MiB limit the file fails to load anyway.
const HASHED_BYTES: u64 = 16 << 20;

/// The hash `duet_config_info` shows for the file at `path` (read just before it loads: an edit landing
/// in between would show its hash for the new content, a window of microseconds).
pub(super) fn file_hash(path: &Path) -> u64 {
    use std::io::Read;
    // Bounded as the configuration's own read is, so a device put in the file's place (`/dev/zero`)
    // cannot fill memory on the reader thread; a FIFO still blocks here, which the reader's time
    // limit is for.
    let mut bytes = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|file| file.take(HASHED_BYTES).read_to_end(&mut bytes));
    read.map_or(0, |_| duet_proxy::config_hash(&bytes))
}

/// What a read found: the content's hash, and the configuration if it was to be loaded.
struct Outcome {
    hash: u64,
    loaded: Option<Result<Reload, duet_config::ConfigErrors>>,
}

/// A read in flight.
struct Pending {
    why: &'static str,
    /// A SIGHUP reloads whatever the file holds; a `--watch` poll only content it has not seen.
    forced: bool,
    deadline: Instant,
    outcome: oneshot::Receiver<Outcome>,
}

/// Reloads `path` into `server`, one read at a time.
pub(super) struct Reloader<'a> {
    path: &'a Path,
    server: &'a Server,
    /// The content last tried, applied or not: a broken file is reported once, not every second.
    seen: u64,
    pending: Option<Pending>,
    /// A SIGHUP that came during a read: the file may have changed since, so it is read again after.
    again: Option<&'static str>,
    /// Reader threads not yet returned (the one in flight and those given up on).
    readers: Arc<AtomicUsize>,
}

impl<'a> Reloader<'a> {
    /// Starts from the content `server` was started with (read here, as the start read it).
    pub(super) fn new(path: &'a Path, server: &'a Server) -> Self {
        Self {
            path,
            server,
            seen: file_hash(path),
            pending: None,
            again: None,
            readers: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// SIGHUP: reload whatever the file holds (after the read in flight, if any).
    pub(super) fn reload(&mut self, why: &'static str) {
        match self.pending {
            Some(_) => self.again = Some(why),
            None => self.start(why, true),
        }
    }

    /// `--watch`: reload if the content changed (unless a read is in flight).
    pub(super) fn poll(&mut self) {
        if self.pending.is_none() {
            self.start("the file changed", false);
        }
    }

    fn start(&mut self, why: &'static str, forced: bool) {
        let readers = self.readers.load(Ordering::Relaxed);
        if readers >= MAX_HUNG {
            if forced {
                self.server.registry().note_reload_failed();
                tracing::error!(
                    "{why}: keeping the running configuration; {readers} earlier reads of {} still hang",
                    self.path.display()
                );
            }
            return;
        }
        let (send, outcome) = oneshot::channel();
        let reader = ReaderCount::new(self.readers.clone());
        let (path, seen) = (self.path.to_path_buf(), self.seen);
        let spawned = std::thread::Builder::new()
            .name("duet-reload".into())
            .spawn(move || {
                let _reader = reader;
                let _ = send.send(read(&path, forced, seen));
            });
        match spawned {
            Ok(_) => {
                self.pending = Some(Pending {
                    why,
                    forced,
                    deadline: Instant::now() + READ_TIMEOUT,
                    outcome,
                })
            }
            Err(error) => self.failed(why, forced, &format!("cannot start a thread: {error}")),
        }
    }

    /// Waits for the read in flight (forever if there is none), then applies what it found, or gives
    /// up on it at its deadline. Cancel-safe: dropped unfinished, the read stays in flight.
    pub(super) async fn settle(&mut self) {
        let Some(pending) = &mut self.pending else {
            return std::future::pending().await;
        };
        let outcome = tokio::time::timeout_at(pending.deadline, &mut pending.outcome).await;
        let Some(Pending { why, forced, .. }) = self.pending.take() else {
            return;
        };
        match outcome {
            Ok(Ok(outcome)) => self.apply(why, outcome),
            Ok(Err(_)) => self.failed(why, forced, "the reading thread panicked"),
            Err(_) => self.failed(
                why,
                forced,
                &format!(
                    "reading it has not finished after {READ_TIMEOUT:?} (a FIFO, a hung mount?)"
                ),
            ),
        }
        if let Some(why) = self.again.take() {
            self.start(why, true);
        }
    }

    fn apply(&mut self, why: &str, outcome: Outcome) {
        self.seen = outcome.hash;
        let path = self.path.display();
        let registry = self.server.registry();
        match outcome.loaded {
            None => {}
            Some(Err(errors)) => {
                registry.note_reload_failed();
                tracing::error!(
                    "{why}: keeping the running configuration; {path} does not load:\n{errors}"
                );
            }
            Some(Ok(reload)) => match self.server.apply(reload) {
                Ok(changes) => {
                    registry.note_config_applied(outcome.hash, true);
                    tracing::info!("{why}: reloaded {path}{}", changed(&changes));
                }
                Err(reason) => {
                    registry.note_reload_failed();
                    tracing::error!("{why}: keeping the running configuration: {reason}");
                }
            },
        }
    }

    /// A read that did not come back: a reload that failed, or for `--watch` a warning.
    fn failed(&self, why: &str, forced: bool, reason: &str) {
        let path = self.path.display();
        if forced {
            self.server.registry().note_reload_failed();
            tracing::error!("{why}: keeping the running configuration; {path}: {reason}");
        } else {
            tracing::warn!("--watch: cannot check {path}: {reason}");
        }
    }
}

/// What a reload changed, for its log line: each change on a line of its own as `duet check --diff`
/// writes it, so that the log says what a reload did and not only that it happened.
fn changed(changes: &[duet_config::Change]) -> String {
    if changes.is_empty() {
        return ": nothing changed".to_owned();
    }
    let s = if changes.len() == 1 { "" } else { "s" };
    let mut text = format!(": {} change{s}", changes.len());
    for change in changes {
        text.push_str("\n  ");
        text.push_str(&change.to_string());
    }
    text
}

/// On a reader thread: the file's hash and, if `forced` or the content is not `seen`, its
/// configuration with the certificates it names.
fn read(path: &Path, forced: bool, seen: u64) -> Outcome {
    let hash = file_hash(path);
    let loaded = (forced || hash != seen).then(|| {
        duet_config::load(path).map(|config| {
            super::check::log_shadowed(path, &config);
            Reload::read(config)
        })
    });
    Outcome { hash, loaded }
}

/// Counts a reader thread while it lives.
struct ReaderCount(Arc<AtomicUsize>);

impl ReaderCount {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for ReaderCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
