//! Reloading the configuration file: read it, and apply it if it loads.

use crate::server::Server;

/// The hash `duet_config_info` shows for the file at `path` (read again just after it loaded: an edit
/// landing in between would show its hash for the previous content, a window of microseconds).
pub(super) fn file_hash(path: &std::path::Path) -> u64 {
    std::fs::read(path).map_or(0, |bytes| duet_proxy::config_hash(&bytes))
}

pub(super) fn reload(path: &std::path::Path, server: &Server, why: &str) {
    match duet_config::load(path) {
        Err(errors) => {
            server.registry().note_reload_failed();
            tracing::error!(
                "{why}: keeping the running configuration; {} does not load:\n{errors}",
                path.display()
            );
        }
        Ok(config) => match server.reload(config) {
            Ok(()) => {
                server.registry().note_config_applied(file_hash(path), true);
                tracing::info!("{why}: reloaded {}", path.display());
            }
            Err(reason) => {
                server.registry().note_reload_failed();
                tracing::error!("{why}: keeping the running configuration: {reason}");
            }
        },
    }
}
