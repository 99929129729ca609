//! Which files a model name means: a cache id (`org/name`, `id@rev`) resolved in the Hugging Face
//! cache, or a local folder or `.gguf` file, and which of the formats it is.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::{ErrorKind, fail};
use crate::hub::Cache;
use crate::hub::resolve::resolve_model;
use crate::models::checkpoint::safetensors_files;

/// The files `name` means: the cache's snapshot of a cache id, or the local path itself (with
/// `--dummy-weights`, a config.json given by path).
pub fn resolve(name: &str, dummy: bool) -> anyhow::Result<PathBuf> {
    if dummy && Path::new(name).exists() {
        return Ok(PathBuf::from(name));
    }
    Ok(resolve_model(name, &Cache::from_env())?.path)
}

/// Where the weights come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A folder with config.json and safetensors.
    HfDir(PathBuf),
    /// A GGUF file.
    Gguf(PathBuf),
    /// Only a config.json: random weights (`--dummy-weights`).
    Dummy(PathBuf),
}

impl Source {
    /// Decides the format of a resolved model path.
    pub fn detect(path: &Path, dummy: bool) -> anyhow::Result<Source> {
        if dummy {
            let cfg = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
            if !cfg.is_file() {
                return Err(fail(
                    ErrorKind::NotFound,
                    format!("--dummy-weights needs a config.json: {} not found", cfg.display()),
                ));
            }
            return Ok(Source::Dummy(cfg));
        }
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Ok(Source::Gguf(path.to_path_buf()));
        }
        if path.is_dir() {
            if path.join("config.json").is_file() && safetensors_files(path).is_ok() {
                return Ok(Source::HfDir(path.to_path_buf()));
            }
            let ggufs = gguf_files(path)?;
            match ggufs.len() {
                1 => return Ok(Source::Gguf(ggufs[0].clone())),
                n if n > 1 => {
                    let names: Vec<String> = ggufs
                        .iter()
                        .filter_map(|p| p.file_name())
                        .map(|n| n.to_string_lossy().into_owned())
                        .collect();
                    return Err(fail(
                        ErrorKind::InvalidInput,
                        format!(
                            "{} holds {n} GGUF files; name one: {}",
                            path.display(),
                            names.join(", ")
                        ),
                    ));
                }
                _ => {}
            }
        }
        Err(fail(
            ErrorKind::NotFound,
            format!("no safetensors or GGUF model in {}", path.display()),
        ))
    }
}

fn gguf_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    out.sort();
    Ok(out)
}
