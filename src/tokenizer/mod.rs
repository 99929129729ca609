//! Tokenizers for models whose files carry no tokenizer.json.
//!
//! Safetensors checkpoints ship an HF `tokenizer.json` that `tokenizers` loads as is; GGUF files
//! describe their tokenizer in metadata instead, in llama.cpp's terms. [`gguf`] turns that
//! description into the same `tokenizers::Tokenizer`, so everything downstream (chat templates,
//! stop tokens, streaming decode) has one tokenizer type to deal with.

mod byte_bpe;
pub mod bytes;
pub mod gguf;
mod pre_split;
mod sentencepiece;
#[cfg(test)]
mod tests;

pub use gguf::{GgufTokenizer, from_gguf_file, from_gguf_metadata};
