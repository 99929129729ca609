//! The compressed-tensors fixtures (tests/fixtures/llama_ct, made by scripts/fixtures/llama_ct.sh),
//! shared by the CPU reference tests and the GPU agreement test.

use std::path::PathBuf;

use serde_json::Value;

/// The fixture folder: beside the sources, or under the current directory when the test binary
/// runs from a copy of the repository elsewhere (the GPU machine).
pub fn dir(name: &str) -> PathBuf {
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama_ct"));
    let base = if built.exists() { built } else { PathBuf::from("tests/fixtures/llama_ct") };
    base.join(name)
}

/// The fixture's reference.json (transformers' outputs).
pub fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(dir(name).join("reference.json")).expect("reference");
    serde_json::from_str(&text).expect("reference JSON")
}
