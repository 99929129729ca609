//! The files of a safetensors checkpoint folder, which every architecture's loader and the
//! memory plan read alike: the shards (through `model.safetensors.index.json` when there is one,
//! never guessed) and their tensors as the headers describe them.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::memory::{FileTensors, safetensors_tensors};
use crate::error::{ErrorKind, fail};

/// The safetensors files of a checkpoint folder, through the index when there is one.
pub fn safetensors_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read(&index).with_context(|| format!("reading {}", index.display()))?;
        let shards = crate::hub::select::index_shards(&text)?;
        let files: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
        for f in &files {
            if !f.exists() {
                return Err(fail(
                    ErrorKind::NotFound,
                    format!("shard {} named by the index is missing", f.display()),
                ));
            }
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(fail(
        ErrorKind::NotFound,
        format!("no model.safetensors or model.safetensors.index.json in {}", dir.display()),
    ))
}

/// The tensors of a checkpoint folder, from its headers (no tensor data is read).
pub fn file_tensors(dir: &Path) -> anyhow::Result<FileTensors> {
    let headers = safetensors_files(dir)?
        .iter()
        .map(|f| {
            crate::inspect::safetensors::read_header(f)
                .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(safetensors_tensors(&headers))
}
