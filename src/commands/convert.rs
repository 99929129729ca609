//! `inferno convert GGUF DIR` (hidden, for developers): writes an HF-format f32 safetensors
//! checkpoint of a llama GGUF, as transformers' GGUF loader would dequantize it. Used to get a
//! real-weight HF checkpoint where the Hub cannot be reached (tests, benchmarks).

use std::path::Path;

use crate::cli::ConvertArgs;
use crate::models::llama::convert;
use crate::models::llama::load::GgufFile;

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let (src, out) = (Path::new(&args.gguf), Path::new(&args.out));
    let mut gguf = GgufFile::open(src)?;
    convert::write_hf_checkpoint(&mut gguf, out)?;
    write_tokenizer(src, out)?;
    println!("{}", args.out);
    Ok(())
}

/// tokenizer.json, tokenizer_config.json (chat template, bos/eos) and generation_config.json.
fn write_tokenizer(src: &Path, out: &Path) -> anyhow::Result<()> {
    let g = crate::tokenizer::gguf::from_gguf_file(src)?;
    g.tokenizer
        .save(out.join("tokenizer.json"), false)
        .map_err(|e| anyhow::anyhow!("writing tokenizer.json: {e}"))?;
    let name = |id: Option<u32>| id.and_then(|i| g.tokenizer.id_to_token(i));
    let cfg = serde_json::json!({
        "bos_token": name(g.bos_id),
        "eos_token": name(g.eos_ids.first().copied()),
        "add_bos_token": g.add_bos,
        "chat_template": g.chat_template,
    });
    std::fs::write(out.join("tokenizer_config.json"), serde_json::to_string_pretty(&cfg)?)?;
    let generation = serde_json::json!({ "bos_token_id": g.bos_id, "eos_token_id": g.eos_ids });
    std::fs::write(out.join("generation_config.json"), serde_json::to_string_pretty(&generation)?)?;
    Ok(())
}
