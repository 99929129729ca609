//! Speculative decoding: a decoding sequence guesses its next few tokens (a draft), and one step
//! runs its last token and the draft as one chunk whose every row is sampled. Row `j` samples
//! the token after draft `j` exactly as a one-token step at that position would (the same
//! logits, bit for bit, wherever the step's kernels give a row the same arithmetic in any batch;
//! the same sampler, history and draw index). The draft is accepted while each row's token equals
//! the next draft; the first row that differs gives its own token, and a fully accepted draft
//! gives the last row's token as a bonus. So a step emits 1 to k + 1 tokens, and they are the
//! tokens plain decoding would have emitted, greedy or sampled (the sample-and-compare form of
//! rejection sampling for a deterministic draft: the chance a draft token is kept is the
//! target's probability of it, and a rejected position's token is drawn from the target's
//! distribution; docs/speculation.md, "Why the output is the target's").
//!
//! - [`ngram`]: prompt lookup over the sequence's own tokens;
//! - [`draft`]: a smaller model with the same tokenizer, run greedily beside the target;
//! - [`eagle`]: an EAGLE-3 head on the target's hidden states;
//! - [`prediction`]: lookup in the text a request says its reply will repeat (OpenAI's
//!   Predicted Outputs), for that request, with or without an engine drafter.
//! - [`Backoff`]: when a sequence's drafts keep failing it drafts less often; where a costly
//!   drafter's drafts keep failing for every sequence, new ones start with it asleep and never
//!   draft ([`Speculator`]);
//! - [`length`]: how long a sequence's drafts are, from how often its draft tokens stand and
//!   what a step's extra rows cost.
//!
//! The engine's [`Speculator`] holds all of it: the engine (`core.rs`) asks it for drafts
//! before each step for the sequences that may take one ([`SpecConfig::max_batch`]), the
//! scheduler fits them into the step (`scheduler.rs`), [`accepted`] decides what the sampled rows
//! keep, and the speculator takes that outcome.

mod backoff;
mod config;
pub mod draft;
pub mod eagle;
pub mod length;
pub mod ngram;
pub mod prediction;
pub mod speculator;

pub use backoff::Backoff;
pub use config::{DEFAULT_DRAFT_TOKENS, Draft, Drafter, MAX_DRAFT_TOKENS, SpecConfig};
pub use ngram::NgramConfig;
pub use speculator::{SpecStats, Speculator};

/// How many of `drafts` the sampled rows accept: `sampled[j]` is row `j`'s token (row 0 is the
/// sequence's last token's, row `j` draft `j`'s), and draft `j` stands while every row before it
/// sampled exactly the draft after it. The tokens emitted are `sampled[..=accepted]`.
pub fn accepted(drafts: &[u32], sampled: &[u32]) -> usize {
    drafts.iter().zip(sampled).take_while(|(d, s)| d == s).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_matching_prefix() {
        assert_eq!(accepted(&[5, 6, 7], &[5, 6, 7, 8]), 3);
        assert_eq!(accepted(&[5, 6, 7], &[5, 9, 7, 8]), 1);
        assert_eq!(accepted(&[5, 6, 7], &[4, 6, 7, 8]), 0);
        assert_eq!(accepted(&[], &[4]), 0);
    }
}
