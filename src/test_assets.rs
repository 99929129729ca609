//! Real tokenizers fetched for the unit tests by `scripts/assets/*.sh` (scripts/test.sh runs
//! them): one loader, so every test finds them the same way and says which script to run when
//! one is missing. The tests that load one are ignored without the `conformance` feature, so a
//! plain `cargo test` runs without them and says what it left out.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use tokenizers::Tokenizer;

use crate::switches::test_var;

/// Where fetched test assets live: `$INFERNO_ASSETS`, else `${INFERNO_CACHE:-~/.cache/inferno}/assets`.
pub fn assets_dir() -> PathBuf {
    if let Some(d) = test_var("INFERNO_ASSETS") {
        return PathBuf::from(d);
    }
    let cache = test_var("INFERNO_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/inferno")
    });
    cache.join("assets")
}

/// The tokenizer in asset `file` (`gptoss-tokenizer.json`, `llama2-tokenizer.json`), loaded once.
pub fn tokenizer(file: &str) -> &'static Tokenizer {
    static LOADED: OnceLock<Mutex<HashMap<String, &'static Tokenizer>>> = OnceLock::new();
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap();
    loaded.entry(file.to_string()).or_insert_with(|| {
        let path = assets_dir().join(file);
        assert!(
            path.is_file(),
            "missing test asset {}: run scripts/assets/gptoss-tokenizer.sh (set INFERNO_ASSETS to use another folder)",
            path.display()
        );
        let t = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
        Box::leak(Box::new(t))
    })
}
