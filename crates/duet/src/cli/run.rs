//! `duet run`: start the server, reload on SIGHUP or `--watch`, drain on SIGTERM.

use super::{
    logging::init_logging,
    reload::{file_hash, Reloader},
};
use crate::{log_file::LogFile, server::Server};

/// The exit code of `duet run` when the drain deadline cut requests or tunnels short (0: a clean drain;
/// 1: an error).
pub const DRAIN_CUT_SHORT: i32 = 3;

/// Serves `path`'s configuration until SIGTERM or SIGINT; returns the exit code.
pub(super) fn run(
    path: &std::path::Path,
    json: bool,
    watch: bool,
    access_log: Option<&std::path::Path>,
) -> i32 {
    let access_log = match access_log.map(LogFile::open).transpose() {
        Ok(file) => file,
        Err(error) => {
            eprintln!("duet: cannot open the access log: {error}");
            return 1;
        }
    };
    let _log = init_logging(json, "info", access_log.as_ref());
    let config = match duet_config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return 1;
        }
    };
    super::check::log_shadowed(path, &config);
    // Every client and backend connection is a descriptor: use all the hard limit allows (as nginx's
    // worker_rlimit_nofile and Envoy do), and say what it is.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(limit, "open file limit"),
        Err(error) => tracing::warn!("cannot raise the open file limit: {error}"),
    }
    let schemes: Vec<&str> = config
        .listeners
        .iter()
        .map(|l| if l.tls.is_some() { "https" } else { "http" })
        .collect();
    let server = match Server::start(config) {
        Ok(server) => server,
        Err(error) => {
            tracing::error!("cannot start: {error}");
            return 1;
        }
    };
    server
        .registry()
        .note_config_applied(file_hash(path), false);
    for (address, scheme) in server.local_addrs().iter().zip(schemes) {
        tracing::info!(
            workers = server.workers(),
            "listening on {scheme}://{address}"
        );
    }
    if let Some(address) = server.admin_addr() {
        tracing::info!("admin on http://{address} (/metrics, /status, /healthz, /ready)");
    }
    let signal = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|runtime| runtime.block_on(control_loop(path, &server, watch, access_log.as_ref())));
    match signal {
        Ok(Ok(name)) => tracing::info!("{name}: draining in-flight requests, then exiting"),
        Ok(Err(error)) | Err(error) => {
            tracing::error!("cannot wait for signals ({error}); stopping")
        }
    }
    match server.shutdown() {
        Ok(true) => {
            tracing::info!("stopped");
            0
        }
        Ok(false) => {
            tracing::warn!("stopped; requests still open at the drain deadline were cut");
            DRAIN_CUT_SHORT
        }
        Err(error) => {
            tracing::error!("shutdown: {error}");
            1
        }
    }
}

/// How often `--watch` reads the configuration file.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits for SIGTERM or SIGINT (returned) and reloads the config file on each SIGHUP, and with `watch`
/// whenever its content changes. A config that does not load is reported with every error, and the
/// running one stays. The file is read on a thread of its own ([`Reloader`]): SIGTERM is heard even
/// while a read hangs.
///
/// `--watch` compares the file's content once a second rather than asking inotify (the `notify` crate):
/// a Kubernetes ConfigMap volume changes by swapping a symlink two levels above the file, which a
/// watch on the file never sees and a watch on its folder sees as a burst of events to debounce; a
/// content hash sees exactly "the bytes changed", and costs one small read a second.
async fn control_loop(
    path: &std::path::Path,
    server: &Server,
    watch: bool,
    access_log: Option<&LogFile>,
) -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut user1 = signal(SignalKind::user_defined1())?;
    let mut poll = tokio::time::interval(WATCH_EVERY);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reloader = Reloader::new(path, server);
    loop {
        // The reloader is used once the `select!` (whose `settle` borrows it) is over.
        let event = tokio::select! {
            _ = terminate.recv() => return Ok("SIGTERM"),
            _ = interrupt.recv() => return Ok("SIGINT"),
            _ = hangup.recv() => Event::Hangup,
            _ = user1.recv() => Event::ReopenLog,
            _ = poll.tick(), if watch => Event::Poll,
            () = reloader.settle() => continue,
        };
        match event {
            Event::Hangup => reloader.reload("SIGHUP"),
            Event::Poll => reloader.poll(),
            Event::ReopenLog => reopen(access_log),
        }
    }
}

enum Event {
    Hangup,
    Poll,
    ReopenLog,
}

/// logrotate's postrotate: new lines go to a new file at the same path.
fn reopen(access_log: Option<&LogFile>) {
    match access_log.map(|file| file.reopen().map(|()| file.path())) {
        Some(Ok(path)) => tracing::info!("SIGUSR1: reopened the access log {}", path.display()),
        Some(Err(error)) => tracing::error!(
            "SIGUSR1: cannot reopen the access log, still writing the old file: {error}"
        ),
        None => tracing::info!("SIGUSR1: no access log file to reopen (it goes to stderr)"),
    }
}
