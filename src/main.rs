//! The `inferno` binary: parse arguments, run one subcommand, print any error on one line and
//! exit with the documented code (see README "Exit codes").

use std::process::ExitCode;

use clap::Parser;
use inferno::cli::Cli;
use inferno::error::kind_of;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match inferno::commands::run(cli) {
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

/// The outermost message plus the innermost cause when it adds something, on one line
/// (library errors can carry backtraces or multi-line text: only their first line is kept).
fn one_line(err: &anyhow::Error) -> String {
    let first = |s: String| s.lines().next().unwrap_or("").trim().to_string();
    let top = first(err.to_string());
    let root = first(err.root_cause().to_string());
    if root == top || top.contains(&root) { top } else { format!("{top}: {root}") }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
