//! Deterministic synthetic data: a seeded token stream that gives the same global batches for
//! any DP size.
//!
//! Sequence `i` of micro-batch `m` of step `t` is a noisy affine walk over the vocabulary
//! (`x[p+1] = (3 x[p] + 1 + noise) mod V`, noise in 0..4), seeded from `(seed, t, m, i)` only:
//! learnable, so the loss falls, and independent of how the batch is split. Each DP rank takes
//! its contiguous slice of every micro-batch; tokens are laid out sequence-first
//! (`t = position * local_batch + sequence`), Megatron's `[s, b]` order. The first `prompt`
//! positions of every sequence are a prompt: inputs without loss (label -1), as in supervised
//! fine-tuning.

use crate::init::SplitMix;

/// One rank's inputs and labels of a micro-batch, `[seq, local_batch]` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroBatch {
    /// Input token ids.
    pub tokens: Vec<i32>,
    /// Target ids (the next token).
    pub labels: Vec<i32>,
}

/// The `seq + 1` tokens of global sequence `sample` of a micro-batch.
fn sequence(
    seed: u64,
    step: usize,
    mb: usize,
    sample: usize,
    len: usize,
    vocab: usize,
) -> Vec<i32> {
    let mut rng = SplitMix::new(
        seed ^ 0xD1B5_4A32_D192_ED03,
        &[step as u64, mb as u64, sample as u64],
    );
    let mut x = (rng.next_u64() % vocab as u64) as usize;
    let mut out = Vec::with_capacity(len);
    for _ in 0..len {
        out.push(x as i32);
        x = (3 * x + 1 + (rng.next_u64() % 4) as usize) % vocab;
    }
    out
}

/// The micro-batch `mb` of step `step` as DP rank `dp_rank` of `dp` sees it.
#[allow(clippy::too_many_arguments)]
pub fn micro_batch(
    seed: u64,
    step: usize,
    mb: usize,
    global_batch: usize,
    dp: usize,
    dp_rank: usize,
    seq: usize,
    vocab: usize,
    prompt: usize,
) -> MicroBatch {
    let b = global_batch / dp;
    let seqs: Vec<Vec<i32>> = (0..b)
        .map(|i| sequence(seed, step, mb, dp_rank * b + i, seq + 1, vocab))
        .collect();
    let mut tokens = vec![0; seq * b];
    let mut labels = vec![0; seq * b];
    for p in 0..seq {
        for (i, s) in seqs.iter().enumerate() {
            tokens[p * b + i] = s[p];
            labels[p * b + i] = if p < prompt { -1 } else { s[p + 1] };
        }
    }
    MicroBatch { tokens, labels }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_slices_concatenate_to_the_global_batch() {
        let (seq, vocab) = (5, 37);
        let full = micro_batch(7, 1, 2, 4, 1, 0, seq, vocab, 0);
        for dp in [2, 4] {
            let b = 4 / dp;
            for r in 0..dp {
                let part = micro_batch(7, 1, 2, 4, dp, r, seq, vocab, 0);
                for p in 0..seq {
                    for i in 0..b {
                        assert_eq!(part.tokens[p * b + i], full.tokens[p * 4 + r * b + i]);
                        assert_eq!(part.labels[p * b + i], full.labels[p * 4 + r * b + i]);
                    }
                }
            }
        }
        assert_ne!(full, micro_batch(7, 1, 3, 4, 1, 0, seq, vocab, 0));
        assert!(full.tokens.iter().all(|&t| (0..vocab as i32).contains(&t)));
        let masked = micro_batch(7, 1, 2, 4, 1, 0, seq, vocab, 2);
        assert_eq!(masked.tokens, full.tokens);
        assert!(masked.labels[..2 * 4].iter().all(|&l| l == -1));
        assert_eq!(masked.labels[2 * 4..], full.labels[2 * 4..]);
    }
}
