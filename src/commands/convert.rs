//! `inferno convert GGUF DIR` (hidden, for developers): writes an HF-format f32 safetensors
//! checkpoint of a llama GGUF, as transformers' GGUF loader would dequantize it. Used to get a
//! real-weight HF checkpoint where the Hub cannot be reached (tests, benchmarks).

use std::path::Path;

use crate::cli::ConvertArgs;
use crate::models::llama::convert;
use crate::models::llama::load::GgufFile;

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let mut gguf = GgufFile::open(Path::new(&args.gguf))?;
    convert::write_hf_checkpoint(&mut gguf, Path::new(&args.out))?;
    println!("{}", args.out);
    Ok(())
}
