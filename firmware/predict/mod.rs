//! Which FFN blocks a layer will need for the coming token, before it runs (LeanStream paper
//! 3.3; DESIGN.md section 6, step 1): a [`Predictor`] writes one priority per block into a
//! fixed buffer, the I/O lanes read the missing blocks highest first, and after the layer has
//! run the predictor is told what was really used.
//!
//! Two predictors stand beside the learned ones ([`hash`]: stacked learnable hashing, paper
//! 3.3.1):
//! - [`PredictKind::Oracle`]: the set the calibrated thresholds pick from the gate computed on
//!   a resident copy of the gate rows kept outside the budget: the upper bound on prediction.
//!   It needs the layer's input and the engine's kernels, so the engine implements it.
//! - [`PredictKind::Stale`]: the previous token's set ([`Stale`], here).

pub mod hash;
pub mod mlp;
pub mod reuse;

use crate::boot::{BootError, Carver, Plan};
use crate::tables::TableError;

/// How many bits of `a` and `b` agree (XNOR and popcount): the binary layers' dot product.
fn agreement(a: &[u64], b: &[u64]) -> u32 {
    a.iter().zip(b).map(|(a, b)| (!(a ^ b)).count_ones()).sum()
}

/// Refuses a predictor table made for another shape: `found` and `want` are (layers, inputs,
/// neurons).
fn check_shape(found: (usize, u32, u32), want: (usize, usize, usize)) -> Result<(), TableError> {
    let (layers, dim, neurons) = want;
    if found != (layers, dim as u32, neurons as u32) {
        return Err(TableError::Damaged(format!(
            "predictor for {} layers of {} inputs and {} neurons, the model has {layers} of {dim} and {neurons}",
            found.0, found.1, found.2
        )));
    }
    Ok(())
}

/// What a predictor does for one layer and token.
pub trait Predictor {
    /// Writes layer `layer`'s priority for each of its blocks into `out` (`out.len()` is the
    /// layer's block count): higher is read sooner, 0 is not needed. `input` is the layer's FFN
    /// input as far as it is known when the prediction is made (the normed residual, or a guess
    /// of it from the layer before).
    fn predict(&mut self, layer: usize, input: &[f32], out: &mut [f32]);

    /// The blocks layer `layer` really used for this token (each below its block count), once
    /// it has run.
    fn observe(&mut self, layer: usize, used: &[u32]);
}

/// The predictors `--predict` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PredictKind {
    Oracle,
    Stale,
    /// Stacked learnable hashing ([`hash`]): ours.
    Hash,
    /// DejaVu's low-rank MLP on the layer's input (DNN_full, [`mlp`]).
    Dejavu,
    /// The same on the previous layer's input (DNN_stale).
    DejavuStale,
    /// A binarized MLP.
    Bnn,
    /// PowerInfer-2: DejaVu's MLP beside hot neurons pinned in the cache (`--cache hot`).
    PowerInfer2,
}

impl PredictKind {
    pub const ALL: [PredictKind; 7] = [
        PredictKind::Oracle,
        PredictKind::Stale,
        PredictKind::Hash,
        PredictKind::Dejavu,
        PredictKind::DejavuStale,
        PredictKind::Bnn,
        PredictKind::PowerInfer2,
    ];

    /// Whether it runs a table made offline (`--predictor`).
    pub fn needs_table(self) -> bool {
        !matches!(self, PredictKind::Oracle | PredictKind::Stale)
    }

    pub fn parse(s: &str) -> Result<PredictKind, UnknownPredictor> {
        match s {
            "oracle" => Ok(PredictKind::Oracle),
            "stale" => Ok(PredictKind::Stale),
            "hash" => Ok(PredictKind::Hash),
            "dejavu" => Ok(PredictKind::Dejavu),
            "dejavu-stale" => Ok(PredictKind::DejavuStale),
            "bnn" => Ok(PredictKind::Bnn),
            "powerinfer2" => Ok(PredictKind::PowerInfer2),
            _ => Err(UnknownPredictor(s.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PredictKind::Oracle => "oracle",
            PredictKind::Stale => "stale",
            PredictKind::Hash => "hash",
            PredictKind::Dejavu => "dejavu",
            PredictKind::DejavuStale => "dejavu-stale",
            PredictKind::Bnn => "bnn",
            PredictKind::PowerInfer2 => "powerinfer2",
        }
    }
}

/// A `--predict` value that names no predictor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPredictor(pub String);

impl std::fmt::Display for UnknownPredictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown predictor '{}': expected oracle, stale, hash, dejavu, dejavu-stale, bnn or powerinfer2",
            self.0
        )
    }
}

impl std::error::Error for UnknownPredictor {}

/// The previous token's blocks: one bit per block and layer, carved once at boot. Before the
/// first token of a sequence nothing is known, so every block gets the same low priority
/// (read in order) rather than none.
pub struct Stale<'a> {
    blocks: usize,
    /// `layers * words` words, layer-major: bit b of layer l is block b's "used last token".
    used: &'a mut [u32],
    /// Whether layer l has seen a token yet (one per layer: 0 or 1).
    seen: &'a mut [u32],
}

impl<'a> Stale<'a> {
    fn words(blocks: usize) -> usize {
        blocks.div_ceil(32)
    }

    /// What [`new`](Self::new) carves, for the boot plan.
    pub fn plan(plan: &mut Plan, layers: usize, blocks: usize) {
        plan.add::<u32>(layers * Self::words(blocks));
        plan.add::<u32>(layers);
    }

    /// The state of `layers` layers of `blocks` blocks each, from `c`.
    pub fn new(c: &mut Carver<'a>, layers: usize, blocks: usize) -> Result<Stale<'a>, BootError> {
        let used = c.take::<u32>(layers * Self::words(blocks))?;
        let seen = c.take::<u32>(layers)?;
        used.fill(0);
        seen.fill(0);
        Ok(Stale { blocks, used, seen })
    }

    /// Forgets every layer's last token (a new sequence starts).
    pub fn reset(&mut self) {
        self.used.fill(0);
        self.seen.fill(0);
    }

    fn layer_bits(&mut self, layer: usize) -> &mut [u32] {
        let w = Self::words(self.blocks);
        &mut self.used[layer * w..][..w]
    }
}

impl Predictor for Stale<'_> {
    fn predict(&mut self, layer: usize, _input: &[f32], out: &mut [f32]) {
        assert_eq!(out.len(), self.blocks, "one priority per block");
        if self.seen[layer] == 0 {
            out.fill(1.0);
            return;
        }
        let bits = self.layer_bits(layer);
        for (b, p) in out.iter_mut().enumerate() {
            *p = if bits[b / 32] >> (b % 32) & 1 == 1 {
                1.0
            } else {
                0.0
            };
        }
    }

    fn observe(&mut self, layer: usize, used: &[u32]) {
        let blocks = self.blocks;
        let bits = self.layer_bits(layer);
        bits.fill(0);
        for &b in used {
            assert!((b as usize) < blocks, "block {b} of {blocks}");
            bits[b as usize / 32] |= 1 << (b % 32);
        }
        self.seen[layer] = 1;
    }
}

/// The predictors' tests' random numbers (xorshift: fixed seeds, no dependency).
#[cfg(test)]
pub(crate) mod test_rng {
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in [-1, 1).
        pub fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::{Arena, ArenaKind};

    #[test]
    fn stale_predicts_the_previous_tokens_blocks_per_layer() {
        let (layers, blocks) = (3, 70);
        let mut plan = Plan::default();
        Stale::plan(&mut plan, layers, blocks);
        let mut arena = Arena::map(ArenaKind::ActivationScratch, plan.bytes).unwrap();
        let mut c = arena.carver();
        let mut p = Stale::new(&mut c, layers, blocks).unwrap();
        assert_eq!(c.used(), plan.bytes, "the plan counts what is carved");
        let mut out = vec![0f32; blocks];
        // Nothing seen yet: every block at the same low priority.
        p.predict(1, &[], &mut out);
        assert!(out.iter().all(|&v| v == 1.0));
        p.observe(1, &[0, 33, 69]);
        p.observe(2, &[5]);
        p.predict(1, &[], &mut out);
        let wanted: Vec<usize> = (0..blocks).filter(|&b| out[b] > 0.0).collect();
        assert_eq!(wanted, vec![0, 33, 69]);
        // The next token replaces the set; other layers keep theirs.
        p.observe(1, &[34]);
        p.predict(1, &[], &mut out);
        assert_eq!(
            (0..blocks).filter(|&b| out[b] > 0.0).collect::<Vec<_>>(),
            vec![34]
        );
        p.predict(2, &[], &mut out);
        assert_eq!(
            (0..blocks).filter(|&b| out[b] > 0.0).collect::<Vec<_>>(),
            vec![5]
        );
        p.reset();
        p.predict(2, &[], &mut out);
        assert!(out.iter().all(|&v| v == 1.0));
    }

    #[test]
    fn predictor_names_parse_and_bad_ones_are_named() {
        for k in PredictKind::ALL {
            assert_eq!(PredictKind::parse(k.name()), Ok(k));
        }
        let e = PredictKind::parse("psychic").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown predictor 'psychic': expected oracle, stale, hash, dejavu, dejavu-stale, bnn or powerinfer2"
        );
    }
}
