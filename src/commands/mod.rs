//! One module per subcommand; [`run`] is the only dispatch point.

pub mod bench;
pub mod convert;
pub mod doctor;
pub mod download;
pub mod list;
pub mod play;

use crate::cli::{Cli, Command};

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Download(args) => download::run(args),
        Command::List(args) => list::run(args),
        Command::Play(args) => play::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => crate::serve::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Convert(args) => convert::run(args),
        Command::TemplateWorker => crate::template::worker::run(),
    }
}
