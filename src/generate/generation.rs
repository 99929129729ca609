//! What one generation did: its tokens and text, why it stopped, and its timings (the engine's
//! sessions report it, front ends print and serve it).

use std::time::Duration;

use super::StopReason;

/// What one generation did.
#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens actually run (the rest came from the cache).
    pub prefilled_tokens: usize,
    pub time_to_first_token: Duration,
    pub decode_time: Duration,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prefilled_tokens as f64 / self.time_to_first_token.as_secs_f64().max(1e-9)
    }
    /// Tokens after the first, over the time after the first.
    pub fn decode_tok_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 { 0.0 } else { n as f64 / self.decode_time.as_secs_f64().max(1e-9) }
    }
}
