//! The `inferno` binary: parse arguments, run one subcommand, print any error on one line and
//! exit with the documented code (docs/operations.md, "Exit codes").

use std::process::ExitCode;

use clap::Parser;
use inferno::cli::Cli;
use inferno::error::{kind_of, one_line};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Chat templates render in worker processes: this binary, started with a hidden subcommand.
    inferno::template::worker::enable_this_binary();
    let result = inferno::commands::run(cli);
    inferno::template::worker::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                // `inferno list | head` is not an error.
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", one_line(&err));
            ExitCode::from(kind_of(&err).exit_code())
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
