//! Fuzzing on stable Rust: every parser of files and requests from strangers, fed structured
//! and mutated inputs (proptest; see tests/fuzz/run.rs for why and how), each target a fixed
//! number of cases in CI and `scripts/fuzz.sh [SECONDS]` for longer runs. Most targets need the
//! SmolLM2 and gpt-oss tokenizer assets (scripts/test.sh fetches them); without the `conformance`
//! feature those are ignored, saying so.
//!
//! - [files]: GGUF (edited real files and generated ones), safetensors headers, model folders
//!   (config.json, quantization_config, the safetensors index).
//! - [tokenizer]: tokenizers built from edited GGUF metadata.
//! - [template]: hostile and edited chat templates.
//! - [harmony]: the harmony parser on random and edited token streams.
//! - [http], [http_layer]: `serve`'s endpoints, raw requests and the HTTP layer's attacks.
//! - [regressions]: each crash the fuzzers found, as the input that found it.

mod common;

#[path = "fuzz/files.rs"]
mod files;
#[path = "fuzz/gguf_writer.rs"]
mod gguf_writer;
#[path = "fuzz/harmony.rs"]
mod harmony;
#[path = "fuzz/http.rs"]
mod http;
#[path = "fuzz/http_layer.rs"]
mod http_layer;
#[path = "fuzz/regressions.rs"]
mod regressions;
#[path = "fuzz/run.rs"]
mod run;
#[path = "fuzz/template.rs"]
mod template;
#[path = "fuzz/tokenizer.rs"]
mod tokenizer;
