//! `inferno download`.

use crate::cli::DownloadArgs;

pub fn run(_args: DownloadArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
