//! `inferno list`.

use crate::cli::ListArgs;

pub fn run(_args: ListArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
