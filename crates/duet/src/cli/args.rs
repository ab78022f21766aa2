//! The command line's clap types: what `duet --help`, the completions and the man page show.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// duet: an HTTP/1.1 and HTTP/2 load balancer (power of two choices, one local view per worker).
#[derive(Debug, Parser)]
#[command(
    name = "duet",
    version,
    about,
    after_help = "Logging: RUST_LOG (default `info`; access-log lines are target `duet::access`).\n\
                  Exit codes of `run`: 0 stopped after a clean drain, 1 error, 3 the drain deadline cut \
                  requests short; 2 for a command line that does not parse."
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
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
    /// Print duet(1) (roff), or with --out write duet(1), a page per command (duet-run(1),
    /// duet-check(1), ...) and duet.yaml(5), the configuration reference: `duet man --out man/`.
    Man {
        /// Write every page into this folder (created if missing) instead of duet(1) to stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub(super) struct ConfigFile {
    /// The YAML configuration file.
    #[arg(short = 'c', long = "config", value_name = "FILE", env = "DUET_CONFIG")]
    pub(super) path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One flat JSON object per line.
    Json,
}
