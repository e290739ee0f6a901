//! Activation sparsity: the FFN computed over the neurons a token needs.
//!
//! - `bundle`: the FFN of a layer held as neuron bundles (gate row j, up row j and down column
//!   j of neuron j stored together), built at boot in the FFN arena, and the sparse SwiGLU over
//!   a chosen set of neurons ([`SparseFfn::forward`]).
//! - `thresholds`: per-layer thresholds on |SiLU(gate) * up| (or |SiLU(gate)|, as in CATS)
//!   that drop a fraction S of neurons on average, calibrated by `leanstream calibrate` and kept
//!   in a `tables/` file (kind "thresh").
//! - `trace`: what the predictors learn from: per layer and token, the residual entering the
//!   FFN, the FFN input, the partial residuals after K priority-ordered stages and the neuron
//!   activations (a safetensors file), and the statistics the report draws from it.
//!
//! Modes (`--ffn`): `dense` (the model's own matrices, every neuron), `oracle` (gate, and up for
//! the `glu` score, computed for every neuron; those at or over the layer's threshold are kept:
//! the upper bound of a perfect predictor; the dropped ones count with their calibrated mean
//! activation unless `--dropped-mean off`), `topk` (the `1 - S` fraction with the largest score
//! in each layer, per token; needs no table).

pub mod bundle;
pub mod cli;
pub mod thresholds;
pub mod tiles;

pub use bundle::Bundles;
pub use thresholds::{DroppedMean, ThresholdLevel, ThresholdTable};

use std::fmt;
use std::str::FromStr;

/// How the FFN picks its neurons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FfnMode {
    /// Every neuron, from the model's own gate/up/down matrices.
    #[default]
    Dense,
    /// Neurons whose score reaches the layer's calibrated threshold.
    Oracle,
    /// The `1 - S` fraction of neurons with the largest score, per token and layer.
    TopK,
}

impl FfnMode {
    pub fn name(self) -> &'static str {
        match self {
            FfnMode::Dense => "dense",
            FfnMode::Oracle => "oracle",
            FfnMode::TopK => "topk",
        }
    }
}

impl FromStr for FfnMode {
    type Err = String;
    fn from_str(s: &str) -> Result<FfnMode, String> {
        match s {
            "dense" => Ok(FfnMode::Dense),
            "oracle" => Ok(FfnMode::Oracle),
            "topk" => Ok(FfnMode::TopK),
            _ => Err(format!(
                "unknown FFN mode '{s}': expected dense, oracle or topk"
            )),
        }
    }
}

/// What a neuron's importance is measured by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Score {
    /// |SiLU(gate) * up|: the neuron's actual activation (gate and up for every neuron).
    #[default]
    Glu,
    /// |SiLU(gate)| (CATS): cheaper, up is computed only for the kept neurons.
    Gate,
}

impl Score {
    pub fn name(self) -> &'static str {
        match self {
            Score::Glu => "glu",
            Score::Gate => "gate",
        }
    }
}

impl FromStr for Score {
    type Err = String;
    fn from_str(s: &str) -> Result<Score, String> {
        match s {
            "glu" => Ok(Score::Glu),
            "gate" => Ok(Score::Gate),
            _ => Err(format!("unknown score '{s}': expected glu or gate")),
        }
    }
}

/// A sparsity S: the fraction of neurons dropped, in [0, 1).
pub fn parse_sparsity(s: &str) -> Result<f32, String> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("sparsity '{s}' is not a number"))?;
    check_sparsity(v)?;
    Ok(v)
}

pub fn check_sparsity(v: f32) -> Result<(), String> {
    if !(0.0..1.0).contains(&v) {
        return Err(format!("sparsity {v} is outside [0, 1)"));
    }
    Ok(())
}

/// The precision of the bundles' down columns (gate and up rows are always the model's bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BundleDown {
    /// Tiles of 32 columns with one scale per output row, added up in integers
    /// (`backend::cpu::down_tiles`): a Q4_0/Q4_1 model's own 4-bit values, other types as int8.
    #[default]
    Tiles,
    /// Q8_0 when the model's down matrix has fewer than 8 bits, else the model's type.
    AtLeast8Bit,
    /// The model's own type (K-quants: Q8_0).
    Model,
}

impl FromStr for BundleDown {
    type Err = String;
    fn from_str(s: &str) -> Result<BundleDown, String> {
        match s {
            "tiles" => Ok(BundleDown::Tiles),
            "q8" => Ok(BundleDown::AtLeast8Bit),
            "model" => Ok(BundleDown::Model),
            _ => Err(format!(
                "unknown --bundle-down '{s}': expected tiles, q8 or model"
            )),
        }
    }
}

/// The FFN's configuration, chosen at boot (and changeable after it among the sparse modes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FfnOptions {
    pub mode: FfnMode,
    pub score: Score,
    /// Fraction of neurons dropped (oracle: on average, through the thresholds; topk: exactly).
    pub sparsity: f32,
    /// Per-layer thresholds for `score` at `sparsity` (oracle mode only).
    pub thresholds: Option<Vec<f32>>,
    /// Precision of the bundles' down columns (fixed at boot).
    pub bundle_down: BundleDown,
    /// The dropped neurons' mean contribution, added back (oracle mode; from the thresholds'
    /// table; None: dropped neurons count as zero).
    pub dropped: Option<DroppedMean>,
}

impl FfnOptions {
    /// Checks the options against a model of `n_layers`.
    pub fn check(&self, n_layers: usize) -> Result<(), String> {
        check_sparsity(self.sparsity)?;
        match self.mode {
            FfnMode::Oracle => match &self.thresholds {
                None => Err("oracle mode needs thresholds (leanstream calibrate)".into()),
                Some(t) if t.len() != n_layers => Err(format!(
                    "{} thresholds for a model of {n_layers} layers",
                    t.len()
                )),
                Some(t) if t.iter().any(|v| !v.is_finite() || *v < 0.0) => {
                    Err("thresholds must be finite and non-negative".into())
                }
                Some(_) => Ok(()),
            },
            _ if self.dropped.is_some() => {
                Err("dropped-neuron means go with thresholds (oracle mode)".into())
            }
            _ => Ok(()),
        }
    }

    /// A short label: `dense`, `oracle-glu-0.50`, `topk-gate-0.80`.
    pub fn label(&self) -> String {
        match self.mode {
            FfnMode::Dense => "dense".into(),
            m => format!("{}-{}-{:.2}", m.name(), self.score.name(), self.sparsity),
        }
    }
}

/// Why sparsity options could not be applied.
#[derive(Debug)]
pub struct SparsityError(pub String);

impl fmt::Display for SparsityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SparsityError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_scores_and_sparsities() {
        assert_eq!("oracle".parse::<FfnMode>().unwrap(), FfnMode::Oracle);
        assert!("sparse"
            .parse::<FfnMode>()
            .unwrap_err()
            .contains("dense, oracle or topk"));
        assert_eq!("gate".parse::<Score>().unwrap(), Score::Gate);
        assert!("relu".parse::<Score>().is_err());
        assert_eq!(parse_sparsity("0.5").unwrap(), 0.5);
        assert_eq!(parse_sparsity("0").unwrap(), 0.0);
        for bad in ["1", "1.5", "-0.1", "NaN", "x"] {
            assert!(parse_sparsity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn oracle_needs_matching_thresholds() {
        let mut o = FfnOptions {
            mode: FfnMode::Oracle,
            sparsity: 0.5,
            ..Default::default()
        };
        assert!(o.check(2).unwrap_err().contains("calibrate"));
        o.thresholds = Some(vec![0.1]);
        assert!(o.check(2).unwrap_err().contains("2 layers"));
        o.thresholds = Some(vec![0.1, f32::NAN]);
        assert!(o.check(2).is_err());
        o.thresholds = Some(vec![0.1, 0.2]);
        o.check(2).unwrap();
        assert_eq!(o.label(), "oracle-glu-0.50");
    }
}
