//! `duet run | check | demo | probe | completions | man`: the command line, parsed by clap
//! (`args.rs`), dispatched here to one module per command.

// Top layer first: `run` uses the modules below it.
mod run;

mod args;
mod reload;
mod check;
mod logging;
mod man;

pub use run::DRAIN_CUT_SHORT;

use crate::demo;
use args::{Cli, Command, LogFormat};
use clap::{CommandFactory, Parser};

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
        } => run::run(
            &config.path,
            log_format == LogFormat::Json,
            watch,
            access_log.as_deref(),
        ),
        Command::Check {
            config,
            resolve,
            diff,
        } => check::check(&config.path, resolve, diff.as_deref()),
        Command::Probe { url } => crate::probe::run(&url),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "duet", &mut std::io::stdout());
            0
        }
        Command::Man { out } => man::run(Cli::command(), out.as_deref()),
        Command::Demo => {
            let _log = logging::init_logging(false, "warn", None);
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
