//! Every architecture inferno runs, one line each: `load` asks here which one reads a model,
//! and names no architecture itself. An architecture is its folder under `models/`, which
//! implements [`Architecture`] and [`super::arch::ArchConfig`]; adding one is that folder, its
//! `mod` line in `models/mod.rs` and a line in [`ARCHITECTURES`]. Draft heads (EAGLE-3) are
//! recognised here too, by the `architectures` their `config.json` names (as vLLM's registry
//! keys every model).

use std::path::Path;

use candle_core::{DType, Device};

use super::arch::Architecture;
use super::batch::BatchModel;
use super::eagle3::{self, Eagle3Head};
use super::{gemma3, gpt_oss, llama, qwen3};
use crate::error::{ErrorKind, fail};

/// The architectures, in the order an unsupported `model_type`'s refusal lists them.
pub const ARCHITECTURES: &[&dyn Architecture] = &[
    &llama::arch::LlamaFamily,
    &qwen3::arch::Qwen3Family,
    &gpt_oss::arch::GptOssFamily,
    &gemma3::arch::Gemma3Family,
];

/// The architecture of a `config.json` without a `model_type`.
const UNNAMED: &dyn Architecture = &llama::arch::LlamaFamily;

/// The architecture that reads a GGUF file no other claims: Llama's reader checks the file with
/// candle's and refuses another architecture in one line.
const GGUF_FALLBACK: &dyn Architecture = &llama::arch::LlamaFamily;

/// The architecture of a `config.json` `model_type`, or the one-line refusal that lists the
/// supported ones.
pub fn for_model_type(kind: Option<&str>) -> anyhow::Result<&'static dyn Architecture> {
    let Some(kind) = kind else { return Ok(UNNAMED) };
    let found = ARCHITECTURES.iter().copied().find(|a| a.model_types().contains(&kind));
    found.ok_or_else(|| {
        let supported: Vec<&str> =
            ARCHITECTURES.iter().flat_map(|a| a.model_types().iter().copied()).collect();
        fail(
            ErrorKind::InvalidInput,
            format!("unsupported architecture {kind:?} (supported: {})", supported.join(", ")),
        )
    })
}

/// The architecture that reads a GGUF file of `general.architecture` `name`.
pub fn for_gguf(name: Option<&str>) -> &'static dyn Architecture {
    let claims = |a: &&dyn Architecture| name.is_some_and(|n| a.gguf_architectures().contains(&n));
    ARCHITECTURES.iter().copied().find(claims).unwrap_or(GGUF_FALLBACK)
}

/// Whether a `config.json` text is a draft head's (EAGLE-3, either published layout): its
/// folder loads beside a model as its drafter (`--draft HEAD`), not as a model.
pub fn is_draft_head(config: &str) -> bool {
    eagle3::is_eagle3(config)
}

/// Whether the head in `dir` reads the model's embedding (it has none of its own; random
/// weights never do): a tensor-parallel model then keeps its whole table on rank 0.
pub fn head_reads_target_embedding(dir: &Path, random: bool) -> bool {
    eagle3::reads_target_embedding(dir, random)
}

/// The draft head in `dir` for `model`, its RoPE tables covering `context` positions: its
/// checkpoint, or random weights in its shapes with `random`.
pub fn load_draft_head(
    dir: &Path,
    model: &dyn BatchModel,
    context: usize,
    dtype: DType,
    device: &Device,
    random: bool,
) -> anyhow::Result<Eagle3Head> {
    let target = eagle3::Target::of(model);
    match random {
        true => Eagle3Head::random(dir, target, context, dtype, device),
        false => Eagle3Head::load(dir, target, context, dtype, device),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_one_architecture() {
        let (mut hf, mut gguf) =
            (std::collections::HashSet::new(), std::collections::HashSet::new());
        for a in ARCHITECTURES {
            for name in a.model_types() {
                assert!(hf.insert(*name), "model_type {name} is claimed twice");
            }
            for name in a.gguf_architectures() {
                assert!(gguf.insert(*name), "GGUF architecture {name} is claimed twice");
            }
        }
        let err = for_model_type(Some("gpt2")).err().unwrap();
        assert_eq!(
            err.to_string(),
            "unsupported architecture \"gpt2\" (supported: llama, mistral, qwen3, gpt_oss, gemma3_text, gemma3)"
        );
        assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput);
    }
}
