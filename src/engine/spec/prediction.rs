//! Drafts from a request's prediction (OpenAI's Predicted Outputs): the caller sends text the
//! reply will mostly repeat (the file being edited, the draft being revised), and the reply's
//! next tokens are guessed as what follows, in the prediction, the reply's last few tokens.
//!
//! The reply so far is matched, not the prompt: its longest suffix of up to [`MAX_N`] tokens
//! that occurs in the prediction with something after it. A reply that has left the prediction
//! (an edited passage) finds it again through a shorter suffix, down to one token. Short
//! suffixes recur, so among a suffix's occurrences the one nearest after where the reply was last
//! found (`at`) wins, else the last one before it: a reply walks through its prediction in
//! order. A reply that has not begun guesses the prediction's first tokens.
//!
//! Only the draft depends on this: the engine verifies it, so the tokens are the ones plain
//! decoding gives.

/// The longest suffix of the reply tried.
pub const MAX_N: usize = 8;

/// Up to `k` tokens that follow the reply's longest matching suffix in `prediction`, and where
/// that match ends (the next `at`); `at` is where the reply was last found.
pub fn propose(reply: &[u32], prediction: &[u32], at: usize, k: usize) -> (Vec<u32>, usize) {
    if k == 0 || prediction.is_empty() {
        return (Vec::new(), at);
    }
    if reply.is_empty() {
        return (prediction[..k.min(prediction.len())].to_vec(), 0);
    }
    for n in (1..=MAX_N.min(reply.len())).rev() {
        let suffix = &reply[reply.len() - n..];
        // Ends of the occurrences followed by at least one token.
        let ends = (n..prediction.len()).filter(|&e| &prediction[e - n..e] == suffix);
        let (mut after, mut before) = (None, None);
        for e in ends {
            if e >= at {
                after = Some(e);
                break;
            }
            before = Some(e);
        }
        if let Some(e) = after.or(before) {
            return (prediction[e..(e + k).min(prediction.len())].to_vec(), e);
        }
    }
    (Vec::new(), at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A naive formulation: every (length, end) pair, the best by length, then by distance
    /// preferring ends at or after `at`.
    fn reference(reply: &[u32], prediction: &[u32], at: usize, k: usize) -> (Vec<u32>, usize) {
        if k == 0 || prediction.is_empty() {
            return (Vec::new(), at);
        }
        if reply.is_empty() {
            return (prediction.iter().take(k).copied().collect(), 0);
        }
        let mut best: Option<(usize, (bool, usize), usize)> = None;
        for n in 1..=MAX_N.min(reply.len()) {
            for e in n..prediction.len() {
                if prediction[e - n..e] != reply[reply.len() - n..] {
                    continue;
                }
                // Lower rank is better: after `at` first (nearest first), then before (nearest).
                let rank = if e >= at { (false, e - at) } else { (true, at - e) };
                let better = match best {
                    None => true,
                    Some((bn, br, _)) => n > bn || (n == bn && rank < br),
                };
                if better {
                    best = Some((n, rank, e));
                }
            }
        }
        match best {
            Some((_, _, e)) => (prediction[e..(e + k).min(prediction.len())].to_vec(), e),
            None => (Vec::new(), at),
        }
    }

    #[test]
    fn follows_the_prediction_and_finds_it_again_after_an_edit() {
        let p = [10, 11, 12, 13, 14, 15, 16];
        assert_eq!(propose(&[], &p, 0, 3), (vec![10, 11, 12], 0));
        assert_eq!(propose(&[10, 11], &p, 0, 3), (vec![12, 13, 14], 2));
        // An edit (99 in place of 12), then back on the prediction at 13.
        assert_eq!(propose(&[10, 11, 99], &p, 2, 3), (vec![], 2));
        assert_eq!(propose(&[10, 11, 99, 13], &p, 2, 3), (vec![14, 15, 16], 4));
        // Nothing follows the end of the prediction.
        assert_eq!(propose(&[15, 16], &p, 5, 3), (vec![], 5));
        // A token that recurs: the occurrence after `at` wins, else the last before it.
        let r = [1, 7, 2, 7, 3, 7, 4];
        assert_eq!(propose(&[7], &r, 3, 1), (vec![3], 4));
        assert_eq!(propose(&[7], &r, 7, 1), (vec![4], 6));
    }

    #[test]
    fn agrees_with_a_naive_search_on_random_inputs() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..3000 {
            let alphabet = rng.random_range(1..5);
            let mut tokens =
                |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..alphabet)).collect() };
            let (reply, prediction) = (tokens(12), tokens(30));
            let reply = &reply[..rng.random_range(0..=12)];
            let prediction = &prediction[..rng.random_range(0..=30)];
            let at = rng.random_range(0..=32);
            let k = rng.random_range(0..6);
            assert_eq!(
                propose(reply, prediction, at, k),
                reference(reply, prediction, at, k),
                "seed {seed}: reply {reply:?} prediction {prediction:?} at {at} k {k}"
            );
        }
    }
}
