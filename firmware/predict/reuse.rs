//! Learned eviction (LeanStream paper 3.3.3): a block's reuse distance (cache accesses until
//! its next use) regressed from the inter-arrival times of its last accesses with the same
//! stacked learnable hashing as the neuron predictor ([`HashNet`]). The output is quantized in
//! equal-probability bins (paper 3.3.1): the net's outputs are the bits of a bin's index, and
//! the table holds each bin's distance. The weight cache's `learned` policy
//! (`stream::policy`) evicts the block whose predicted next use is farthest.
//!
//! Features, all on a log scale over `log2(NEVER)` so they fall in [0, 1]: the gaps between
//! the block's last `HISTORY` accesses, the newest first (`NEVER` where there were fewer),
//! then its access count. Tables: kind "reuse" (`crate::tables`), keyed by the model whose
//! access stream they were trained on.

use super::hash::{HashNet, HashShape};
use crate::tables::{self, TableError};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const KIND: &str = "reuse";
pub const VERSION: u32 = 1;

/// Gaps a block remembers.
pub const HISTORY: usize = 4;
pub const FEATURES: usize = HISTORY + 1;
/// A gap not seen yet, and the cap on every gap and distance (ticks).
pub const NEVER: u32 = 1 << 24;
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
    /// Per bin (2^code_bits): its distance in ticks (the median of its training targets).
    pub distance: Vec<u32>,
    pub seed: u64,
}

/// A block's features (see the module's comment) into `out`.
pub fn features(gaps: &[u32; HISTORY], count: u32, out: &mut [f32; FEATURES]) {
    let scale = 1.0 / (NEVER as f32).log2();
    for (o, &g) in out.iter_mut().zip(gaps) {
        *o = (1.0 + g.min(NEVER) as f32).log2() * scale;
    }
    out[HISTORY] = (1.0 + count.min(NEVER) as f32).log2() * scale;
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

    /// The bin a block of these gaps and count falls in: bit i set when a majority of the
    /// output heads votes for output i.
    pub fn bin(&self, gaps: &[u32; HISTORY], count: u32) -> usize {
        let mut x = [0f32; FEATURES];
        features(gaps, count, &mut x);
        self.bin_of(&x)
    }

    /// The bin of a block of features `x` (see [`features`]).
    pub fn bin_of(&self, x: &[f32; FEATURES]) -> usize {
        let bits = self.code_bits as usize;
        let mut votes = [0u8; MAX_CODE_BITS];
        self.net.scores(self.shape(), x, 1.0, &mut votes[..bits]);
        let heads = self.out_heads;
        (0..bits).fold(0, |code, i| code | (((2 * votes[i] > heads) as usize) << i))
    }

    /// The predicted reuse distance in ticks.
    pub fn distance(&self, gaps: &[u32; HISTORY], count: u32) -> u32 {
        self.distance[self.bin(gaps, count)]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-layer net whose single hash reads the newest gap's sign against a threshold:
    /// bucket 1 (newest gap short) gives code 0, bucket 0 code 1: a block just reused is
    /// predicted back in 10 ticks, any other in 5000.
    pub(crate) fn table() -> ReuseTable {
        let mut proj = vec![0i8; FEATURES];
        proj[0] = -100;
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
                // Short newest gap (feature below 0.5): -x + 0.5 >= 0, bucket 1.
                proj_bias: vec![0.5],
                first_table: vec![0, u64::MAX],
                middle: Vec::new(),
                // The output hash: bit set when more than 32 of y's 64 bits are set.
                out_w: vec![u64::MAX],
                out_thr: vec![32],
                // Bucket 0 (y all clear): code bit 0 set; bucket 1: clear.
                out_table: vec![1, 0],
                read: 1,
            },
            distance: vec![10, 5000],
            seed: 0,
        }
    }

    #[test]
    fn short_recent_gaps_predict_a_short_distance() {
        let t = table();
        t.validate().unwrap();
        assert_eq!(t.distance(&[3, 4, 5, 6], 4), 10);
        assert_eq!(t.distance(&[1 << 20, NEVER, NEVER, NEVER], 1), 5000);
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
    }

    #[test]
    fn features_are_log_scaled_into_the_unit_interval() {
        let mut x = [0f32; FEATURES];
        features(&[0, 1, NEVER, u32::MAX], NEVER, &mut x);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 1.0 / 24.0).abs() < 1e-6);
        assert!((x[2] - 1.0).abs() < 1e-6 && (x[3] - 1.0).abs() < 1e-6);
        assert!((x[4] - 1.0).abs() < 1e-6);
    }
}
