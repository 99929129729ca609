//! An engine's speculation settings (`--draft`, `--draft-tokens`): where its drafts come from
//! and how long they may be.

use super::ngram::NgramConfig;

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafter {
    /// Prompt lookup over the sequence's own tokens ([`super::ngram`]).
    Ngram,
    /// A smaller model with the same tokenizer, loaded beside the target ([`super::draft`]).
    Model,
    /// An EAGLE-3 head reading the target's hidden states ([`super::eagle`]).
    Eagle,
}

/// What `--draft MODEL|HEAD` loads beside the model.
pub enum Draft {
    Model(Box<dyn crate::models::batch::BatchModel>),
    Eagle(Box<crate::models::eagle3::Eagle3Head>),
}

/// Speculation settings of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    pub drafter: Drafter,
    /// Draft tokens a sequence verifies in one step at most (`--draft-tokens`).
    pub draft_tokens: usize,
    /// Sequences speculate only while at most this many run: past it a step's extra rows cost
    /// more than the tokens they save.
    pub max_batch: usize,
    pub ngram: NgramConfig,
    /// A draft model or head drafts `draft_tokens` whenever it may, whatever its steps cost,
    /// backing off as n-gram drafts do (tests of what verifying its drafts does); otherwise its
    /// drafts are as long as they pay for, it makes none where they cannot pay
    /// ([`super::length`]), and its misses back off by their cost
    /// ([`super::Backoff::for_spec`]).
    pub regardless_of_cost: bool,
}

/// Draft tokens a step verifies at most: a graph step's rows for one sequence all fit in one
/// 16-token block (`engine/graphs.rs`).
pub const MAX_DRAFT_TOKENS: usize = 15;

/// Default `--draft-tokens`.
pub const DEFAULT_DRAFT_TOKENS: usize = 4;

impl SpecConfig {
    /// Drafts of up to `draft_tokens` tokens from a draft model.
    pub fn model(draft_tokens: usize) -> anyhow::Result<SpecConfig> {
        Ok(SpecConfig { drafter: Drafter::Model, ..SpecConfig::ngram(draft_tokens)? })
    }

    /// What an engine without a drafter speculates with while a request carries a prediction:
    /// up to 8 tokens a step (a prediction's runs are long; a GPU verifies fewer, by
    /// [`crate::models::batch::BatchModel::invariant_rows`]).
    pub fn for_predictions() -> SpecConfig {
        SpecConfig {
            drafter: Drafter::Ngram,
            draft_tokens: 8,
            max_batch: 8,
            ngram: NgramConfig::default(),
            regardless_of_cost: false,
        }
    }

    /// N-gram drafting of up to `draft_tokens` tokens, with the default limits.
    pub fn ngram(draft_tokens: usize) -> anyhow::Result<SpecConfig> {
        if draft_tokens == 0 || draft_tokens > MAX_DRAFT_TOKENS {
            return Err(crate::error::fail(
                crate::error::ErrorKind::InvalidInput,
                format!("--draft-tokens must be 1 to {MAX_DRAFT_TOKENS}, not {draft_tokens}"),
            ));
        }
        Ok(SpecConfig {
            drafter: Drafter::Ngram,
            draft_tokens,
            max_batch: 8,
            ngram: NgramConfig::default(),
            regardless_of_cost: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_tokens_are_bounded() {
        assert!(SpecConfig::ngram(0).is_err());
        assert!(SpecConfig::ngram(MAX_DRAFT_TOKENS + 1).is_err());
        assert_eq!(SpecConfig::ngram(4).map(|c| c.draft_tokens).ok(), Some(4));
    }
}
