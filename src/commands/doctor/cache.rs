//! The Hugging Face cache: where it is, what it holds, whether a token is set.

use std::path::PathBuf;

use serde::Serialize;

use super::Problem;
use crate::commands::list::{self, Row};
use crate::hub::Cache;
use crate::hub::api::HubConfig;

#[derive(Debug, Serialize)]
pub struct CacheReport {
    pub root: PathBuf,
    pub exists: bool,
    /// Bytes of all cached revisions' files.
    pub size_bytes: u64,
    /// Cached model revisions (as `inferno list` shows them).
    pub models: usize,
    /// Revisions `list` reports as unusable (missing files, no snapshot).
    pub broken: Vec<String>,
    pub hf_token_set: bool,
    pub offline: bool,
    /// Why the cache could not be read, if it could not.
    pub error: Option<String>,
    #[serde(skip)]
    pub rows: Vec<Row>,
}

pub fn check() -> CacheReport {
    let cache = Cache::from_env();
    let hub = HubConfig::from_env();
    let root = cache.root().to_path_buf();
    let exists = root.is_dir();
    let (rows, error) = if exists {
        match list::collect(&cache) {
            Ok(rows) => (rows, None),
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        }
    } else {
        (Vec::new(), None)
    };
    let broken = rows
        .iter()
        .filter_map(|r| r.info.as_ref().err().map(|why| format!("{}: {why}", r.model)))
        .collect();
    CacheReport {
        size_bytes: rows.iter().map(|r| r.size).sum(),
        models: rows.len(),
        broken,
        hf_token_set: hub.token.is_some(),
        offline: hub.offline,
        root,
        exists,
        error,
        rows,
    }
}

impl CacheReport {
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Some(e) = &self.error {
            out.push(Problem {
                what: format!("the cache at {} cannot be read: {e}", self.root.display()),
                fix: "check the folder's permissions, or point HF_HUB_CACHE at another folder"
                    .into(),
            });
        }
        for b in &self.broken {
            out.push(Problem {
                what: format!("cached model {b}"),
                fix: "download it again with `inferno download <model>` (it resumes and verifies)"
                    .into(),
            });
        }
        out
    }
}
