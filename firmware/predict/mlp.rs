//! The baselines' predictors (LeanStream paper 4.3.5, Table 6), in the same runtime as ours:
//! - DejaVu's low-rank two-layer MLP (Liu et al. 2023): scores = W2 relu(W1 x + b1) + b2, f32,
//!   on the layer's own FFN input (DNN_full) or on the previous layer's (DNN_stale, known a layer
//!   ahead; `PredictorInput::PrevFfnInput`). PowerInfer-2 uses this predictor beside its pinned
//!   hot neurons.
//! - A binarized MLP (BNN, Hubara et al. 2016): the input's signs against binary first-layer
//!   weights (XNOR and popcount against a learned threshold per hidden unit), then each neuron's
//!   score is how many hidden bits agree with its binary second-layer row.
//!
//! Both read each layer's `read` top-scored neurons (ties to the lower index), set offline for
//! a target recall, as the hashing predictor does. Tables: kind "mlppred" (`crate::tables`).

use super::agreement;
use super::hash::PredictorInput;
use crate::tables::{self, TableError};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const KIND: &str = "mlppred";
/// 2: residual inputs are read divided by their RMS (`PredictorInput::scale`).
pub const VERSION: u32 = 2;

/// Most hidden units (the scratch is sized by it).
pub const MAX_RANK: usize = 4096;

/// One layer's weights.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MlpWeights {
    /// `w1`: `dim` rows of `rank` (input-major, so x streams once); `w2`: `neurons` rows of
    /// `rank`.
    Real {
        w1: Vec<f32>,
        b1: Vec<f32>,
        w2: Vec<f32>,
        b2: Vec<f32>,
    },
    /// `w1`: `rank` rows of `words(dim)` sign bits (1 is +1), `thr1`: hidden bit h is set when
    /// more than `thr1[h]` input signs agree with row h; `w2`: `neurons` rows of `words(rank)`.
    Binary {
        w1: Vec<u64>,
        thr1: Vec<u16>,
        w2: Vec<u64>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlpNet {
    pub weights: MlpWeights,
    /// Neurons read per token.
    pub read: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlpPredictorTable {
    pub model: String,
    pub dim: u32,
    pub neurons: u32,
    pub rank: u32,
    pub input: PredictorInput,
    pub binary: bool,
    pub sparsity: f32,
    pub target_recall: f32,
    pub seed: u64,
    pub layers: Vec<MlpNet>,
}

fn words(bits: usize) -> usize {
    bits.div_ceil(64)
}

/// Whether every row of `bits` bits leaves the bits past `bits` in its last word clear (the
/// popcounts count them as agreeing and subtract them).
fn pad_clear(rows: &[u64], bits: usize) -> bool {
    let w = words(bits);
    let used = bits - 64 * (w - 1);
    used == 64 || rows.chunks_exact(w).all(|r| r[w - 1] >> used == 0)
}

impl MlpPredictorTable {
    /// The name `--predict` and the report give it.
    pub fn name(&self) -> &'static str {
        match (self.binary, self.input) {
            (true, _) => "bnn",
            (false, PredictorInput::PrevFfnInput) => "dejavu-stale",
            (false, _) => "dejavu",
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let (dim, n, r) = (self.dim as usize, self.neurons as usize, self.rank as usize);
        if dim == 0 || n == 0 || !(1..=MAX_RANK).contains(&r) {
            return Err(format!("dim {dim}, neurons {n}, rank {r} (1..={MAX_RANK})"));
        }
        for (l, net) in self.layers.iter().enumerate() {
            let ok = match (&net.weights, self.binary) {
                (MlpWeights::Real { w1, b1, w2, b2 }, false) => {
                    w1.len() == dim * r
                        && b1.len() == r
                        && w2.len() == n * r
                        && b2.len() == n
                        && w1
                            .iter()
                            .chain(b1)
                            .chain(w2)
                            .chain(b2)
                            .all(|v| v.is_finite())
                }
                (MlpWeights::Binary { w1, thr1, w2 }, true) => {
                    w1.len() == r * words(dim)
                        && thr1.len() == r
                        && w2.len() == n * words(r)
                        && pad_clear(w1, dim)
                        && pad_clear(w2, r)
                }
                _ => false,
            };
            if !ok {
                return Err(format!("layer {l}: weights of the wrong shape or kind"));
            }
            if net.read == 0 || net.read as usize > n {
                return Err(format!("layer {l}: reads {} of {n} neurons", net.read));
            }
        }
        Ok(())
    }

    /// The weights' bytes as the daemon holds them.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|n| match &n.weights {
                MlpWeights::Real { w1, b1, w2, b2 } => {
                    4 * (w1.len() + b1.len() + w2.len() + b2.len())
                }
                MlpWeights::Binary { w1, thr1, w2 } => 8 * (w1.len() + w2.len()) + 2 * thr1.len(),
            })
            .sum()
    }

    pub fn encode(&self, model_id: u64) -> Vec<u8> {
        tables::encode(KIND, VERSION, model_id, self)
    }

    pub fn decode(
        bytes: &[u8],
        model_id: u64,
        layers: usize,
        dim: usize,
        neurons: usize,
    ) -> Result<MlpPredictorTable, TableError> {
        let t: MlpPredictorTable = tables::decode(bytes, KIND, VERSION, model_id)?;
        super::check_shape((t.layers.len(), t.dim, t.neurons), (layers, dim, neurons))?;
        t.validate().map_err(TableError::Damaged)?;
        Ok(t)
    }

    pub fn read(
        path: &Path,
        model_id: u64,
        layers: usize,
        dim: usize,
        neurons: usize,
    ) -> Result<MlpPredictorTable, TableError> {
        Self::decode(&tables::read_bytes(path)?, model_id, layers, dim, neurons)
    }

    /// Layer `l`'s score per neuron into `out`, from `x`; `hidden` is scratch of `rank`.
    pub fn scores(&self, l: usize, x: &[f32], hidden: &mut [f32], out: &mut [f32]) {
        let r = self.rank as usize;
        assert_eq!(x.len(), self.dim as usize, "one input per dimension");
        assert_eq!(out.len(), self.neurons as usize, "one score per neuron");
        let hidden = &mut hidden[..r];
        match &self.layers[l].weights {
            MlpWeights::Real { w1, b1, w2, b2 } => {
                let scale = self.input.scale(x);
                if scale == 1.0 {
                    hidden.copy_from_slice(b1);
                } else {
                    hidden.fill(0.0);
                }
                for (xi, row) in x.iter().zip(w1.chunks_exact(r)) {
                    for (hv, w) in hidden.iter_mut().zip(row) {
                        *hv += xi * w;
                    }
                }
                if scale != 1.0 {
                    for (hv, b) in hidden.iter_mut().zip(b1) {
                        *hv = *hv * scale + b;
                    }
                }
                for hv in hidden.iter_mut() {
                    *hv = hv.max(0.0);
                }
                for ((o, row), b) in out.iter_mut().zip(w2.chunks_exact(r)).zip(b2) {
                    *o = b + row
                        .iter()
                        .zip(hidden.iter())
                        .map(|(w, h)| w * h)
                        .sum::<f32>();
                }
            }
            MlpWeights::Binary { w1, thr1, w2 } => {
                // The input's signs, then the hidden bits, in fixed arrays.
                let mut xs = [0u64; MAX_RANK / 64];
                let dw = words(x.len());
                assert!(dw <= xs.len(), "dim up to {MAX_RANK}");
                for (i, &v) in x.iter().enumerate() {
                    if v >= 0.0 {
                        xs[i / 64] |= 1 << (i % 64);
                    }
                }
                let xs = &xs[..dw];
                // Padding bits past `dim` agree on both sides (0 and 0): subtract them.
                let pad = (64 * dw - x.len()) as u32;
                let mut hs = [0u64; MAX_RANK / 64];
                for (h, row) in w1.chunks_exact(dw).enumerate() {
                    let agree = agreement(xs, row) - pad;
                    if agree > thr1[h] as u32 {
                        hs[h / 64] |= 1 << (h % 64);
                    }
                }
                let rw = words(r);
                let hs = &hs[..rw];
                let rpad = (64 * rw - r) as u32;
                for (o, row) in out.iter_mut().zip(w2.chunks_exact(rw)) {
                    let agree = agreement(hs, row) - rpad;
                    *o = agree as f32;
                }
            }
        }
    }
}

/// The `read` highest of `scores` (ties to the lower index) into `out`, ascending; `order` is
/// scratch of `scores.len()`. Returns how many.
pub fn top_read(scores: &[f32], read: usize, order: &mut [u32], out: &mut [u32]) -> usize {
    let n = scores.len();
    let read = read.min(n);
    if read == 0 {
        return 0;
    }
    let order = &mut order[..n];
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    let by = |a: &u32, b: &u32| {
        scores[*b as usize]
            .total_cmp(&scores[*a as usize])
            .then(a.cmp(b))
    };
    order.select_nth_unstable_by(read - 1, by);
    let top = &mut order[..read];
    top.sort_unstable();
    out[..read].copy_from_slice(top);
    read
}

#[cfg(test)]
mod tests;
