//! htpasswd and JWKS files followed without a signal: every file a route's `auth:` reads is read
//! once an [`AUTH_FILES_EVERY`] and, when its content changed, every route reading it gets the new
//! users or keys: the running configuration is handed to the workers again with them (as a reload
//! does, so each worker rebuilds its routes between requests, keeping their counters). Content is
//! compared, as for the certificate files (`tls::rotation`) and `--watch`: a Kubernetes Secret
//! changes by swapping a symlink, which an inotify watch on the file never sees.
//!
//! A file that does not load (a half-written line, a JWKS cut short) keeps the users or keys in
//! use, logged once per content; the next change is tried again. There is no counter of these:
//! `duet_config_reloads_total` counts the operator's reloads, and the warning names the file and
//! its line.

use duet_config::{filter::auth::MAX_FILE_BYTES, Config};
use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
    thread,
    time::Duration,
};
use tokio::sync::watch;

/// How often the files are read.
pub(crate) const AUTH_FILES_EVERY: Duration = Duration::from_secs(1);

/// How often the thread looks whether duet is stopping while it waits.
const SHUTDOWN_CHECK: Duration = Duration::from_millis(100);

/// What the thread follows and feeds.
pub(crate) struct AuthFiles {
    pub(crate) config: Arc<watch::Sender<Arc<Config>>>,
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// Starts the thread; it ends when `shutdown` turns true. Reading a file may block (a FIFO, a hung
/// mount): only this thread waits then, never a worker.
pub(crate) fn spawn(files: AuthFiles) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("duet-auth-files".into())
        .spawn(move || run(files))
}

fn run(AuthFiles { config, shutdown }: AuthFiles) {
    // Each file's content hash as last read. Emptied whenever the configuration is another one (a
    // reload read the files itself, maybe before a change this thread saw), so every file is
    // compared again with what the routes hold; the first round does that for the start.
    let mut seen: HashMap<PathBuf, u64> = HashMap::new();
    let mut followed: Option<Arc<Config>> = None;
    loop {
        let mut waited = Duration::ZERO;
        while waited < AUTH_FILES_EVERY {
            if *shutdown.borrow() {
                return;
            }
            thread::sleep(SHUTDOWN_CHECK);
            waited += SHUTDOWN_CHECK;
        }
        let current = config.borrow().clone();
        if !followed.as_ref().is_some_and(|f| Arc::ptr_eq(f, &current)) {
            seen.clear();
        }
        for path in files(&current) {
            let Some(text) = read(&path) else { continue };
            let hash = duet_proxy::config_hash(text.as_bytes());
            if seen.insert(path.clone(), hash) != Some(hash) {
                apply(&config, &path, &text);
            }
        }
        followed = Some(config.borrow().clone());
    }
}

/// Every file the routes' `auth:` reads, each once.
fn files(config: &Config) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = Vec::new();
    let watched = (config.routes.iter()).filter_map(|r| r.filters.auth.as_ref()?.watched_file());
    for path in watched {
        if !paths.iter().any(|p| p == path) {
            paths.push(path.to_owned());
        }
    }
    paths
}

/// The file's text, if it can be read whole (a file that cannot is left for the next round).
fn read(path: &Path) -> Option<String> {
    let mut text = String::new();
    let file = std::fs::File::open(path).ok()?;
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= MAX_FILE_BYTES).then_some(text)
}

/// Gives every route reading `path` the users or keys of `text`, if they differ from its own; a
/// text that does not load changes nothing.
fn apply(config: &watch::Sender<Arc<Config>>, path: &Path, text: &str) {
    let mut refused = None;
    let mut routes = Vec::new();
    config.send_if_modified(|config| {
        let mut updates = Vec::new();
        for (index, route) in config.routes.iter().enumerate() {
            let Some(auth) = &route.filters.auth else {
                continue;
            };
            if auth.watched_file() != Some(path) {
                continue;
            }
            match auth.with_file_text(text) {
                Ok(changed) if changed != *auth => updates.push((index, changed)),
                Ok(_) => {}
                Err(error) => refused = Some(error),
            }
        }
        if refused.is_some() || updates.is_empty() {
            return false;
        }
        let config = Arc::make_mut(config);
        for (index, changed) in updates {
            routes.push(config.routes[index].name.clone());
            config.routes[index].filters.auth = Some(changed);
        }
        true
    });
    if let Some(error) = refused {
        tracing::warn!(
            "auth file changed but does not load ({error}): the users or keys in use stay until \
             it changes again"
        );
    } else if !routes.is_empty() {
        tracing::info!(
            file = %path.display(),
            routes = %routes.join(","),
            "auth file changed: its users or keys are in use"
        );
    }
}
