//! Prompt lookup (n-gram) drafting: the tokens that followed the latest earlier occurrence of the
//! sequence's last few tokens. No weights and no device work; it pays where a reply copies its
//! input (code edits, quoting summaries, retrieval answers), where the copied run is accepted
//! whole.
//!
//! The longest suffix first (`max_n` tokens down to `min_n`): a longer match predicts better.
//! Among occurrences of one suffix the latest wins (vLLM takes the earliest): in an edit the
//! latest copy is the one being reproduced, and in a repeated pattern it continues the current
//! period.

/// How the lookup matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest suffix that may match: shorter ones recur by chance ("of the") and waste verify
    /// rows.
    pub min_n: usize,
    /// Longest suffix tried.
    pub max_n: usize,
}

impl Default for NgramConfig {
    fn default() -> Self {
        NgramConfig { min_n: 3, max_n: 5 }
    }
}

/// Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
/// of `min_n..=max_n` tokens; empty when no such suffix occurred before.
pub fn propose(tokens: &[u32], k: usize, cfg: NgramConfig) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (cfg.min_n.max(1)..=cfg.max_n).rev() {
        if n >= len {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Occurrences starting before the suffix itself, the latest first; the match must be
        // followed by at least one token.
        let found = (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix);
        if let Some(i) = found {
            let from = i + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A naive formulation: every earlier window of every length, the best by (length, start).
    fn reference(tokens: &[u32], k: usize, cfg: NgramConfig) -> Vec<u32> {
        let len = tokens.len();
        let mut best: Option<(usize, usize)> = None;
        for n in cfg.min_n.max(1)..=cfg.max_n {
            if n >= len {
                break;
            }
            for i in 0..len - n {
                if tokens[i..i + n] == tokens[len - n..] && best.is_none_or(|b| (n, i) > b) {
                    best = Some((n, i));
                }
            }
        }
        match best {
            Some((n, i)) if k > 0 => tokens[i + n..(i + n + k).min(len)].to_vec(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn copies_what_followed_the_latest_longest_match() {
        let cfg = NgramConfig { min_n: 2, max_n: 3 };
        // "1 2 3 4 5 … 1 2 3": the suffix 1 2 3 was followed by 4 5.
        assert_eq!(propose(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 2, cfg), vec![4, 5]);
        // Two occurrences of 7 8: the latest (followed by 6) wins.
        assert_eq!(propose(&[7, 8, 5, 7, 8, 6, 7, 8], 3, cfg), vec![6, 7, 8]);
        // Fewer than k after the match.
        assert_eq!(propose(&[1, 2, 3, 1, 2], 5, cfg), vec![3, 1, 2]);
        assert!(propose(&[1, 2, 3, 4], 4, cfg).is_empty());
        assert!(propose(&[1, 2, 1, 2], 0, cfg).is_empty());
    }

    #[test]
    fn agrees_with_a_naive_search_on_random_sequences() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..2000 {
            let len = rng.random_range(0..60);
            let alphabet = rng.random_range(1..6);
            let tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..alphabet)).collect();
            let min_n = rng.random_range(1..4);
            let cfg = NgramConfig { min_n, max_n: min_n + rng.random_range(0..4) };
            let k = rng.random_range(0..8);
            assert_eq!(
                propose(&tokens, k, cfg),
                reference(&tokens, k, cfg),
                "seed {seed}: {tokens:?} k {k} {cfg:?}"
            );
        }
    }
}
