//! The text side of a model: tokenizer, chat template and end-of-sequence ids, from an HF
//! folder (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `config.json`,
//! `generation_config.json`) or from GGUF metadata.

use std::path::Path;

use anyhow::Context;
use tokenizers::Tokenizer;

use super::Source;
use crate::error::{ErrorKind, fail};
use crate::generate::stop::eos_ids_from;
use crate::template::ChatTemplate;

pub struct TextSide {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub eos_ids: Vec<u32>,
}

impl TextSide {
    /// Token ids of a raw prompt (the tokenizer adds BOS where the model wants it).
    pub fn encode_raw(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        self.encode(text, true)
    }

    /// Token ids of a rendered chat prompt: the template already wrote the special tokens.
    pub fn encode_chat(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        self.encode(text, false)
    }

    fn encode(&self, text: &str, special: bool) -> anyhow::Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, special)
            .map_err(|e| anyhow::anyhow!("tokenizing the prompt: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }
}

pub fn load(source: &Source) -> anyhow::Result<TextSide> {
    match source {
        Source::HfDir(dir) => from_hf_dir(dir),
        Source::Gguf(path) => from_gguf(path),
        // Random weights with a real tokenizer beside their config.json (serving benchmarks).
        Source::Dummy(config) => {
            match config.parent().filter(|d| d.join("tokenizer.json").is_file()) {
                Some(dir) => from_hf_dir(dir),
                None => Err(fail(
                    ErrorKind::InvalidInput,
                    "a model with dummy weights has no tokenizer (put a tokenizer.json beside its config.json)",
                )),
            }
        }
    }
}

fn read_json(path: &Path) -> anyhow::Result<Option<serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text)
                .map_err(|e| fail(ErrorKind::Integrity, format!("{}: {e}", path.display())))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn from_hf_dir(dir: &Path) -> anyhow::Result<TextSide> {
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.exists() {
        return Err(fail(ErrorKind::NotFound, format!("no tokenizer.json in {}", dir.display())));
    }
    let tokenizer = Tokenizer::from_file(&tok_path)
        .map_err(|e| fail(ErrorKind::Integrity, format!("{}: {e}", tok_path.display())))?;
    let tok_cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(serde_json::Value::Null);
    let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
    let template = if jinja.is_some() || tok_cfg.get("chat_template").is_some() {
        Some(ChatTemplate::from_files(&tok_cfg, jinja.as_deref())?)
    } else {
        None
    };
    let config = read_json(&dir.join("config.json"))?.unwrap_or(serde_json::Value::Null);
    let gen_cfg = read_json(&dir.join("generation_config.json"))?;
    let mut eos_ids = eos_ids_from(&config, gen_cfg.as_ref());
    if let Some(eos) =
        template.as_ref().and_then(|t| t.eos_token()).and_then(|t| tokenizer.token_to_id(t))
        && !eos_ids.contains(&eos)
    {
        eos_ids.push(eos);
    }
    Ok(TextSide { tokenizer, template, eos_ids })
}

fn from_gguf(path: &Path) -> anyhow::Result<TextSide> {
    let g = crate::tokenizer::gguf::from_gguf_file(path)?;
    let name = |id: Option<u32>| id.and_then(|i| g.tokenizer.id_to_token(i));
    let template = match &g.chat_template {
        Some(src) => {
            Some(ChatTemplate::new(src, name(g.bos_id), name(g.eos_ids.first().copied()))?)
        }
        None => None,
    };
    Ok(TextSide { eos_ids: g.eos_ids, template, tokenizer: g.tokenizer })
}
