//! Command-line definitions (clap derive). Each subcommand's arguments are a struct that its
//! module in `commands/` receives whole.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "inferno", version, about = "Run open-weight LLMs on NVIDIA GPUs", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Download a model from the Hugging Face Hub into the standard HF cache.
    Download(DownloadArgs),
    /// List the models in the Hugging Face cache (also those other tools downloaded).
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// Model repository on the Hub, e.g. `openai/gpt-oss-20b`.
    pub repo: String,
    /// Branch, tag or commit to download.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Only weight files matching these globs (e.g. `*Q4_K_M.gguf`); config and tokenizer files
    /// are still fetched. Repeatable.
    #[arg(long = "include", value_name = "GLOB")]
    pub include: Vec<String>,
    /// Skip files matching these globs. Repeatable.
    #[arg(long = "exclude", value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Print the files that would be downloaded and their total size; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Machine-readable output: a JSON array, one object per cached model revision.
    #[arg(long)]
    pub json: bool,
}
