//! One module per subcommand; [`run`] is the only dispatch point.

pub mod bench;
pub mod convert;
pub mod download;
pub mod list;

use crate::cli::{Cli, Command};

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Download(args) => download::run(args),
        Command::List(args) => list::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Convert(args) => convert::run(args),
    }
}
