//! `duet run | check | demo`.

use crate::{demo, Server};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// duet: an HTTP/1.1 load balancer (power of two choices, one local view per worker).
#[derive(Debug, Parser)]
#[command(
    name = "duet",
    version,
    about,
    after_help = "Logging: RUST_LOG (default `info`; access-log lines are target `duet::access`).\n\
                  Exit codes of `run`: 0 stopped after a clean drain, 1 error, 3 the drain deadline cut \
                  requests short; 2 for a command line that does not parse."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve. SIGHUP reloads FILE (the running configuration stays if it does not load); SIGTERM
    /// drains.
    Run {
        #[command(flatten)]
        config: ConfigFile,
        /// How log lines are written.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Also reload when FILE's content changes (checked every second): a Kubernetes ConfigMap
        /// update then needs no SIGHUP.
        #[arg(long)]
        watch: bool,
        /// Write the access log (one line per request) to this file instead of stderr; SIGUSR1
        /// reopens it (after logrotate moved it away).
        #[arg(long, value_name = "PATH")]
        access_log: Option<PathBuf>,
    },
    /// Validate a configuration file (every error, with file, line and column) and print a summary.
    Check {
        #[command(flatten)]
        config: ConfigFile,
        /// Also look up each backend host name and say which do not resolve from here.
        #[arg(long)]
        resolve: bool,
        /// Also say what a reload from OLD (the running file, say) to this one would change, and
        /// what of it needs a restart.
        #[arg(long, value_name = "OLD")]
        diff: Option<PathBuf>,
    },
    /// Run a local demo: three loopback backends (one slow) behind each policy.
    Demo,
    /// GET an http:// URL (e.g. the admin /healthz); exit 0 on a 2xx within 2 s. A container health
    /// check that needs no shell or curl.
    Probe {
        /// The URL, e.g. http://127.0.0.1:9901/healthz.
        url: String,
    },
    /// Print a shell completion script: `duet completions bash > /etc/bash_completion.d/duet`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `duet man > duet.1; man ./duet.1`.
    Man,
}

#[derive(Debug, Args)]
struct ConfigFile {
    /// The YAML configuration file.
    #[arg(short = 'c', long = "config", value_name = "FILE", env = "DUET_CONFIG")]
    path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One flat JSON object per line.
    Json,
}

/// The exit code of `duet run` when the drain deadline cut requests or tunnels short (0: a clean drain;
/// 1: an error).
pub const DRAIN_CUT_SHORT: i32 = 3;

/// Runs the command line (`args` without the program name); returns the process exit code.
pub fn main(args: Vec<String>) -> i32 {
    let cli = match Cli::try_parse_from(std::iter::once("duet".to_owned()).chain(args)) {
        Ok(cli) => cli,
        Err(error) => {
            // Help and version go to stdout with 0; usage errors to stderr with 2.
            let _ = error.print();
            return error.exit_code();
        }
    };
    match cli.command {
        Command::Run {
            config,
            log_format,
            watch,
            access_log,
        } => run(
            &config.path,
            log_format == LogFormat::Json,
            watch,
            access_log.as_deref(),
        ),
        Command::Check {
            config,
            resolve,
            diff,
        } => check(&config.path, resolve, diff.as_deref()),
        Command::Probe { url } => crate::probe::run(&url),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "duet", &mut std::io::stdout());
            0
        }
        Command::Man => {
            let mut page = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut page) {
                Ok(()) => {
                    use std::io::Write;
                    let _ = std::io::stdout().write_all(&page);
                    0
                }
                Err(error) => {
                    eprintln!("duet man: {error}");
                    1
                }
            }
        }
        Command::Demo => {
            let _log = init_logging(false, "warn", None);
            match demo::run() {
                Ok(()) => 0,
                Err(error) => {
                    eprintln!("duet demo: {error}");
                    1
                }
            }
        }
    }
}

/// Logs to stderr through a writer thread, rather than taking stderr's lock and making a write syscall
/// per line. Workers gather their access-log lines (one per request) into chunks first
/// (`log_buffer.rs`). Lines are never dropped: past 128 Ki queued chunks the workers wait. Whatever is
/// queued is written when the returned guards drop. With `access_log`, the access log (target
/// `duet::access`) goes to that file instead, through a writer thread of its own.
fn init_logging(
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

/// Validates the file offline (nothing but the file and the certificates it names is read); with
/// `resolve`, also looks up each backend host name and says which do not resolve from here.
fn check(path: &std::path::Path, resolve: bool, old: Option<&std::path::Path>) -> i32 {
    let config = match duet_config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return 1;
        }
    };
    // Certificates are parsed too, as `run` would.
    let tls_errors: Vec<String> = config
        .listeners
        .iter()
        .enumerate()
        .filter_map(|(i, l)| Some((i, crate::tls::acceptor(l.tls.as_ref()?).err()?)))
        .map(|(i, e)| {
            format!(
                "{}:{}: listeners[{i}].tls.{}: {e}",
                path.display(),
                e.at,
                e.field
            )
        })
        .collect();
    if !tls_errors.is_empty() {
        eprintln!("{}", tls_errors.join("\n"));
        return 1;
    }
    let resolver = resolve.then(crate::system_resolver);
    // A closed stdout (`duet check ... | head`) is not an error worth a panic.
    use std::io::Write;
    let mut out = summary(path, &config, resolver.as_ref());
    if let Some(old_path) = old {
        let old_config = match duet_config::load(old_path) {
            Ok(config) => config,
            Err(errors) => {
                eprintln!("{errors}");
                return 1;
            }
        };
        let changes = duet_config::diff(&old_config, &config);
        if changes.is_empty() {
            out.push_str(&format!("no changes from {}\n", old_path.display()));
        } else {
            out.push_str(&format!(
                "{} change{} from {} (a reload applies them between requests):\n",
                changes.len(),
                if changes.len() == 1 { "" } else { "s" },
                old_path.display()
            ));
            for change in &changes {
                out.push_str(&format!("  {change}\n"));
            }
        }
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    0
}

fn summary(
    path: &std::path::Path,
    config: &duet_config::Config,
    resolver: Option<&crate::Resolver>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{}: ok", path.display());
    let workers = crate::worker_count(config.workers);
    let _ = match config.workers {
        duet_config::Workers::Auto => writeln!(out, "  workers: {workers} (auto: one per CPU)"),
        duet_config::Workers::Count(_) => writeln!(out, "  workers: {workers}"),
    };
    for listener in &config.listeners {
        let _ = writeln!(out, "  listener {}", listener.address);
    }
    for route in &config.routes {
        let host = match &route.host {
            None => "*".to_owned(),
            Some(duet_config::HostPattern::Exact(h)) => h.clone(),
            Some(duet_config::HostPattern::Wildcard(s)) => format!("*{s}"),
        };
        let _ = writeln!(
            out,
            "  route {} host {host} path {} -> {}",
            route.name, route.path_prefix, config.clusters[route.cluster].name
        );
    }
    let mut unresolved = Vec::new();
    for cluster in &config.clusters {
        let checks = match &cluster.health_check {
            Some(check) => format!("health checks {} every {:?}", check.path, check.interval),
            None => "no health checks".to_owned(),
        };
        let _ = writeln!(
            out,
            "  cluster {} policy {} backends {}, {checks}, {} attempts",
            cluster.name,
            cluster.policy.name(),
            cluster.backends.len(),
            cluster.retries.attempts
        );
        for backend in &cluster.backends {
            let (resolved, found) = lookup(&backend.address, resolver);
            if !found {
                unresolved.push(backend.address.to_string());
            }
            let _ = writeln!(
                out,
                "    {} weight {}{resolved}",
                backend.address, backend.weight
            );
        }
    }
    if !unresolved.is_empty() {
        let _ = writeln!(
            out,
            "  not resolved from here: {} (duet runs anyway: those endpoints stay empty, 503, until they resolve)",
            unresolved.join(", ")
        );
    }
    out
}

/// What `check` says about a backend's address, and whether it resolved (IP addresses and names not
/// looked up count as found).
fn lookup(
    address: &duet_config::BackendAddress,
    resolver: Option<&crate::Resolver>,
) -> (String, bool) {
    use duet_config::BackendAddress;
    match (address, resolver) {
        (BackendAddress::Ip(_), _) => (String::new(), true),
        (BackendAddress::Name { .. }, None) => (
            " (host name: resolved when duet runs; --resolve looks it up now)".to_owned(),
            true,
        ),
        (BackendAddress::Name { .. }, Some(resolver)) => match resolver(&address.to_string()) {
            Ok(addresses) if !addresses.is_empty() => {
                let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
                (format!(" -> {}", list.join(", ")), true)
            }
            Ok(_) => (" -> does not resolve: no address".to_owned(), false),
            Err(error) => (format!(" -> does not resolve: {error}"), false),
        },
    }
}

fn run(
    path: &std::path::Path,
    json: bool,
    watch: bool,
    access_log: Option<&std::path::Path>,
) -> i32 {
    let access_log = match access_log.map(crate::log_file::LogFile::open).transpose() {
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

/// The hash `duet_config_info` shows for the file at `path` (read again just after it loaded: an edit
/// landing in between would show its hash for the previous content, a window of microseconds).
fn file_hash(path: &std::path::Path) -> u64 {
    std::fs::read(path).map_or(0, |bytes| duet_proxy::config_hash(&bytes))
}

/// How often `--watch` reads the configuration file.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits for SIGTERM or SIGINT (returned) and reloads the config file on each SIGHUP, and with `watch`
/// whenever its content changes. A config that does not load is reported with every error, and the
/// running one stays.
///
/// `--watch` compares the file's content once a second rather than asking inotify (the `notify` crate):
/// a Kubernetes ConfigMap volume changes by swapping a symlink two levels above the file, which a
/// watch on the file never sees and a watch on its folder sees as a burst of events to debounce; a
/// content hash sees exactly "the bytes changed", and costs one small read a second.
async fn control_loop(
    path: &std::path::Path,
    server: &Server,
    watch: bool,
    access_log: Option<&crate::log_file::LogFile>,
) -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut user1 = signal(SignalKind::user_defined1())?;
    let mut poll = tokio::time::interval(WATCH_EVERY);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The content last tried, applied or not: a broken file is reported once, not every second.
    let mut seen = file_hash(path);
    loop {
        let why = tokio::select! {
            _ = terminate.recv() => return Ok("SIGTERM"),
            _ = interrupt.recv() => return Ok("SIGINT"),
            _ = hangup.recv() => "SIGHUP",
            _ = user1.recv() => {
                // logrotate's postrotate: new lines go to a new file at the same path.
                match access_log.map(|file| file.reopen().map(|()| file.path())) {
                    Some(Ok(path)) => tracing::info!("SIGUSR1: reopened the access log {}", path.display()),
                    Some(Err(error)) => tracing::error!("SIGUSR1: cannot reopen the access log, still writing the old file: {error}"),
                    None => tracing::info!("SIGUSR1: no access log file to reopen (it goes to stderr)"),
                }
                continue;
            }
            _ = poll.tick(), if watch => {
                let now = file_hash(path);
                if now == seen {
                    continue;
                }
                "the file changed"
            }
        };
        seen = file_hash(path);
        reload(path, server, why);
    }
}

fn reload(path: &std::path::Path, server: &Server, why: &str) {
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
