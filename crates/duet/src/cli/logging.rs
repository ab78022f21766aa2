//! Where log lines go: stderr or the access-log file, each through a writer thread.

/// Logs to stderr through a writer thread, rather than taking stderr's lock and making a write syscall
/// per line. Workers gather their access-log lines (one per request) into chunks first
/// (`log_buffer.rs`). Lines are never dropped: past 128 Ki queued chunks the workers wait. Whatever is
/// queued is written when the returned guards drop. With `access_log`, the access log (target
/// `duet::access`) goes to that file instead, through a writer thread of its own.
pub(super) fn init_logging(
    json: bool,
    default: &str,
    access_log: Option<&crate::log_file::LogFile>,
) -> Vec<tracing_appender::non_blocking::WorkerGuard> {
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    use std::io::IsTerminal;
    let writer_thread = |name: &str| {
        tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(false)
            .thread_name(name)
    };
    let (stderr, stderr_guard) = writer_thread("duet-log").finish(std::io::stderr());
    let mut guards = vec![stderr_guard];
    match access_log {
        Some(file) => {
            let (access, guard) = writer_thread("duet-access-log").finish(file.clone());
            guards.push(guard);
            crate::log_buffer::set_sink(access.clone());
            let is_access = |meta: &tracing::Metadata<'_>| meta.target() == "duet::access";
            install(
                json,
                filter,
                access.with_filter(is_access).or_else(stderr),
                false,
            );
        }
        None => {
            crate::log_buffer::set_sink(stderr.clone());
            install(json, filter, stderr, std::io::stderr().is_terminal());
        }
    }
    // Access-log lines are formatted by duet itself (the same bytes, far cheaper than tracing's
    // formatter for a line per request) and gathered per worker (`log_buffer.rs`).
    duet_proxy::set_access_log_sink(json, crate::log_buffer::write_access);
    guards
}

fn install<W>(json: bool, filter: tracing_subscriber::EnvFilter, writer: W, ansi: bool)
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    let _ = if json {
        // One flat object per line (no nested `fields`), numbers as numbers: what log pipelines index.
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
