//! Learned eviction (LeanStream paper 3.3.3): a block's reuse distance regressed from its
//! access history with the same stacked learnable hashing as the neuron predictor
//! ([`HashNet`]). The output is quantized in equal-probability bins (paper 3.3.1): the net's
//! outputs are the bits of a bin's index, and the table holds each bin's mean distance. The
//! weight cache's `learned` policy (`stream::policy`) evicts the block whose predicted next use
//! is farthest.
//!
//! Time is counted in TOKENS, not in cache accesses: a cache sees about one active set's worth
//! of accesses per token, so distances in accesses mostly measure where in a token a block
//! falls, which its history cannot tell. The token clock needs no help from the engine: a
//! block is wanted at most once per token (per layer), so an access to a block already used
//! in the current token starts the next one ([`History::begin`]).
//!
//! A block's features ([`features`]), all in [0, 1], describe it as of the token its
//! prediction counts from (`base`: the current token, or the next one for a block already used
//! in this one): whether it was used in each of the `BITS` tokens before `base`, the tokens
//! since its last use (log scale), its share of the tokens so far (square root) and its
//! access count (log scale). The target is the tokens from `base` to its next use, capped at
//! `HORIZON`. The trainer (`leanstream train-eviction`), the simulator and the weight cache
//! all keep the history with [`History`], so they compute the same features.
//!
//! Tables: kind "reuse" (`crate::tables`), keyed by the model whose access stream they were
//! trained on.

use super::hash::{HashNet, HashShape};
use crate::tables::{self, TableError};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const KIND: &str = "reuse";
/// 2: features and distances in tokens (1: in cache accesses).
pub const VERSION: u32 = 2;

/// Tokens of a block's access bitmap.
pub const BITS: usize = 8;
pub const FEATURES: usize = BITS + 3;
/// The cap on a reuse distance (tokens): a block not back within it counts as this far.
pub const HORIZON: u32 = 64;
/// Most bits of a bin index.
pub const MAX_CODE_BITS: usize = 8;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReuseTable {
    /// The model and access stream it was trained on, for messages and the report.
    pub model: String,
    pub trained_on: String,
    pub depth: u8,
    pub heads: u8,
    pub tau: u8,
    pub out_heads: u8,
    pub out_tau: u8,
    /// Outputs of the net: the bits of a bin's index.
    pub code_bits: u8,
    pub net: HashNet,
    /// Per bin (2^code_bits): its distance in tokens (the mean of its training targets).
    pub distance: Vec<f32>,
    pub seed: u64,
}

/// A block's features (see the module's comment) into `out`, from its history: `bits` (bit j:
/// used in token `at - j`), `at` (the token of its last use), `count` (its uses; 0: never
/// used), as of token `now`. Returns `base`, the token the predicted distance counts from.
pub fn features(bits: u64, at: u32, count: u32, now: u32, out: &mut [f32; FEATURES]) -> u32 {
    if count == 0 {
        out.fill(0.0);
        out[BITS] = 1.0;
        return now;
    }
    let base = if at >= now { at + 1 } else { now };
    // Tokens between the last use and base - 1 (0: used in the token just before base).
    let gap = base - 1 - at;
    let recent = if gap >= 64 { 0 } else { bits << gap };
    for (j, o) in out[..BITS].iter_mut().enumerate() {
        *o = (recent >> j & 1) as f32;
    }
    out[BITS] = ((1.0 + gap as f32).log2() / (1.0 + HORIZON as f32).log2()).min(1.0);
    out[BITS + 1] = (count as f32 / base as f32).sqrt().min(1.0);
    out[BITS + 2] = ((1.0 + count as f32).log2() / 20.0).min(1.0);
    base
}

/// The token clock and every block's access history, sized once for `blocks` blocks (no
/// allocation after [`History::new`]).
#[derive(Clone, Debug)]
pub struct History {
    now: u32,
    /// Per block: bit j set when it was used in token `at - j`.
    bits: Vec<u64>,
    at: Vec<u32>,
    count: Vec<u32>,
}

impl History {
    pub fn new(blocks: usize) -> History {
        History {
            now: 0,
            bits: vec![0; blocks],
            at: vec![0; blocks],
            count: vec![0; blocks],
        }
    }

    /// The current token.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// The first half of an access to `block`: starts the next token when the block was
    /// already used in this one (true then). [`History::record`] is the second half.
    pub fn begin(&mut self, block: usize) -> bool {
        let next = self.count[block] > 0 && self.at[block] == self.now;
        if next {
            self.now += 1;
        }
        next
    }

    /// The second half of an access: `block` is used in the current token.
    pub fn record(&mut self, block: usize) {
        let gap = self.now - self.at[block];
        let bits = &mut self.bits[block];
        *bits = if self.count[block] == 0 || gap >= 64 {
            1
        } else {
            (*bits << gap) | 1
        };
        self.at[block] = self.now;
        self.count[block] = self.count[block].saturating_add(1);
    }

    /// An access: [`History::begin`] then [`History::record`].
    pub fn access(&mut self, block: usize) -> bool {
        let next = self.begin(block);
        self.record(block);
        next
    }

    /// Whether `block` was used in the last `BITS` tokens before the current one, or in it.
    pub fn recent(&self, block: usize) -> bool {
        self.count[block] > 0 && self.at[block] + BITS as u32 >= self.now
    }

    /// Uses of `block` so far.
    pub fn count(&self, block: usize) -> u32 {
        self.count[block]
    }

    /// `block`'s features now (see [`features`]); returns their base token.
    pub fn features(&self, block: usize, out: &mut [f32; FEATURES]) -> u32 {
        features(
            self.bits[block],
            self.at[block],
            self.count[block],
            self.now,
            out,
        )
    }
}

impl ReuseTable {
    pub fn shape(&self) -> HashShape {
        HashShape {
            heads: self.heads as usize,
            tau: self.tau as usize,
            out_heads: self.out_heads as usize,
            out_tau: self.out_tau as usize,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let bits = self.code_bits as usize;
        if !(1..=MAX_CODE_BITS).contains(&bits) {
            return Err(format!("{bits} code bits: 1 to {MAX_CODE_BITS}"));
        }
        self.net
            .check(self.shape(), FEATURES, bits, self.depth as usize)?;
        if self.distance.len() != 1 << bits {
            return Err(format!(
                "{} bin distances for {bits} code bits",
                self.distance.len()
            ));
        }
        if let Some(d) = self
            .distance
            .iter()
            .find(|d| !(0.0..=HORIZON as f32).contains(*d))
        {
            return Err(format!("a bin distance of {d} tokens (0 to {HORIZON})"));
        }
        Ok(())
    }

    pub fn encode(&self, model_id: u64) -> Vec<u8> {
        tables::encode(KIND, VERSION, model_id, self)
    }

    pub fn decode(bytes: &[u8], model_id: u64) -> Result<ReuseTable, TableError> {
        let t: ReuseTable = tables::decode(bytes, KIND, VERSION, model_id)?;
        t.validate().map_err(TableError::Damaged)?;
        Ok(t)
    }

    pub fn read(path: &Path, model_id: u64) -> Result<ReuseTable, TableError> {
        Self::decode(&tables::read_bytes(path)?, model_id)
    }

    /// The bin of a block of features `x` (see [`features`]): bit i set when a majority of
    /// the output heads votes for output i.
    pub fn bin_of(&self, x: &[f32; FEATURES]) -> usize {
        let bits = self.code_bits as usize;
        let mut votes = [0u8; MAX_CODE_BITS];
        self.net.scores(self.shape(), x, 1.0, &mut votes[..bits]);
        let heads = self.out_heads;
        (0..bits).fold(0, |code, i| code | (((2 * votes[i] > heads) as usize) << i))
    }

    /// The predicted tokens from the features' base to the next use: the expected bin
    /// distance, each output bit set with the share of the heads voting for it (bits taken
    /// as independent). The expectation, not the likeliest bin, is what ranks blocks: most
    /// recently used blocks' likeliest distance is "next token", while their expected ones
    /// differ widely.
    pub fn distance_of(&self, x: &[f32; FEATURES]) -> f32 {
        let bits = self.code_bits as usize;
        let mut votes = [0u8; MAX_CODE_BITS];
        self.net.scores(self.shape(), x, 1.0, &mut votes[..bits]);
        let heads = self.out_heads as f32;
        let mut p = [0f32; MAX_CODE_BITS];
        for (p, &v) in p.iter_mut().zip(&votes[..bits]) {
            *p = v as f32 / heads;
        }
        self.distance
            .iter()
            .enumerate()
            .map(|(k, &d)| {
                let pk: f32 = (0..bits)
                    .map(|i| if k >> i & 1 == 1 { p[i] } else { 1.0 - p[i] })
                    .product();
                pk * d
            })
            .sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-layer net whose single hash reads the access count: a block used more than once
    /// gives code 0 (back in 1 token), one used once code 1 (back in 40).
    pub(crate) fn table() -> ReuseTable {
        let mut proj = vec![0i8; FEATURES];
        proj[BITS + 2] = 100;
        ReuseTable {
            model: "test".into(),
            trained_on: "unit".into(),
            depth: 2,
            heads: 1,
            tau: 1,
            out_heads: 1,
            out_tau: 1,
            code_bits: 1,
            net: HashNet {
                proj,
                proj_scale: vec![0.01],
                // Count 2 or more (the feature at log2(3) / 20 = 0.079): bucket 1.
                proj_bias: vec![-0.065],
                first_table: vec![0, u64::MAX],
                middle: Vec::new(),
                // The output hash: bit set when more than 32 of y's 64 bits are set.
                out_w: vec![u64::MAX],
                out_thr: vec![32],
                // Bucket 0 (y all clear): code bit 0 set; bucket 1: clear.
                out_table: vec![1, 0],
                read: 1,
            },
            distance: vec![1.0, 40.0],
            seed: 0,
        }
    }

    #[test]
    fn the_token_clock_and_a_prediction_from_the_history() {
        let t = table();
        t.validate().unwrap();
        let mut h = History::new(2);
        let mut x = [0f32; FEATURES];
        // Token 0: blocks 0 and 1; token 1: block 0 only (its repeat starts token 1).
        assert!(!h.access(0));
        assert!(!h.access(1));
        assert!(h.access(0), "block 0 again: a new token");
        assert_eq!(h.now(), 1);
        // Block 0, used in token 1, counts from token 2; block 1 from token 1.
        assert_eq!(h.features(0, &mut x), 2);
        assert_eq!(x[..2], [1.0, 1.0]);
        assert_eq!(t.distance_of(&x), 1.0, "used twice");
        assert_eq!(h.features(1, &mut x), 1);
        assert_eq!(x[..2], [1.0, 0.0]);
        assert_eq!(t.distance_of(&x), 40.0, "used once");

        let bytes = t.encode(1);
        assert_eq!(ReuseTable::decode(&bytes, 1).unwrap(), t);
        assert!(ReuseTable::decode(&bytes, 2).is_err());
        let mut bad = t.clone();
        bad.distance.pop();
        let e = ReuseTable::decode(&bad.encode(1), 1).unwrap_err();
        assert!(
            e.to_string().contains("1 bin distances for 1 code bits"),
            "{e}"
        );
        bad.distance = vec![1.0, f32::NAN];
        let e = ReuseTable::decode(&bad.encode(1), 1).unwrap_err();
        assert!(e.to_string().contains("a bin distance of NaN"), "{e}");
    }

    #[test]
    fn features_describe_the_history_as_of_the_base_token() {
        let mut x = [0f32; FEATURES];
        // Never used: no bits, the longest gap.
        assert_eq!(features(0, 0, 0, 5, &mut x), 5);
        assert_eq!(x[..BITS], [0.0; BITS]);
        assert_eq!(x[BITS], 1.0);
        // Used in tokens 3 and 5 (bits 0 and 2 of `at` 5), now token 7: base 7, gap 1.
        assert_eq!(features(0b101, 5, 2, 7, &mut x), 7);
        assert_eq!(x[..4], [0.0, 1.0, 0.0, 1.0]);
        assert!((x[BITS] - 1.0 / (65f32).log2()).abs() < 1e-6);
        assert!((x[BITS + 1] - (2.0f32 / 7.0).sqrt()).abs() < 1e-6);
        assert!((x[BITS + 2] - (3f32).log2() / 20.0).abs() < 1e-6);
        // Used in the current token 7: base 8, its own use is bit 0.
        assert_eq!(features(0b1, 7, 1, 7, &mut x), 8);
        assert_eq!(x[..2], [1.0, 0.0]);
        assert_eq!(x[BITS], 0.0);
        // Long gone: the bitmap is empty, the gap capped.
        assert_eq!(features(u64::MAX, 0, 64, 500, &mut x), 500);
        assert_eq!(x[..BITS], [0.0; BITS]);
        assert_eq!(x[BITS], 1.0);
        assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
    }
}
