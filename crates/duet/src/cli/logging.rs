//! Where log lines go: stderr or the access-log file, each through a writer thread.

/// What keeps the writer threads: dropping it writes whatever is queued.
pub(super) struct LogGuards {
    _tracing: tracing_appender::non_blocking::WorkerGuard,
    _access: Option<crate::log_buffer::Guard>,
}

/// Logs to stderr through a writer thread, rather than taking stderr's lock and making a write syscall
/// per line. Access-log lines (target `duet::access`, one per request) have a writer thread of their
/// own, to which workers hand them in chunks (`log_buffer.rs`): to stderr as well, or with `access_log`
/// to that file. Lines are never dropped: past 128,000 queued lines (access log: chunks) the writers
/// wait. Whatever is queued is written when the returned guards drop.
pub(super) fn init_logging(
    json: bool,
    default: &str,
    access_log: Option<&crate::log_file::LogFile>,
) -> LogGuards {
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    use std::io::IsTerminal;
    let (stderr, stderr_guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("duet-log")
        .finish(std::io::stderr());
    let started = match access_log {
        Some(file) => crate::log_buffer::start(file.clone()),
        None => crate::log_buffer::start(std::io::stderr()),
    };
    let access_guard = started.unwrap_or_else(|error| {
        eprintln!("duet: cannot start the access log's writer thread: {error}");
        None
    });
    match access_log {
        Some(_) => {
            let is_access = |meta: &tracing::Metadata<'_>| meta.target() == "duet::access";
            let access = || crate::log_buffer::AccessWriter;
            install(
                json,
                filter,
                access.with_filter(is_access).or_else(stderr),
                false,
            );
        }
        None => install(json, filter, stderr, std::io::stderr().is_terminal()),
    }
    // Access-log lines are formatted by duet itself (the same bytes, far cheaper than tracing's
    // formatter for a line per request) and gathered per worker (`log_buffer.rs`). After `install`:
    // whether the access log is on is asked of the subscriber when the sink is set.
    duet_proxy::set_access_log_sink(json, crate::log_buffer::append_access);
    LogGuards {
        _tracing: stderr_guard,
        _access: access_guard,
    }
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
