//! Activation sparsity: the FFN computed over the neurons a token needs.
//!
//! - `bundle`: the FFN of a layer held as neuron bundles (gate row j, up row j and down column
//!   j of neuron j stored together), built at boot in the FFN arena, and the sparse SwiGLU over
//!   a chosen set of neurons (`SparseFfn::forward`).
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

pub use bundle::{BundleError, Bundles};
pub use thresholds::{DroppedMean, ThresholdLevel, ThresholdTable, ThresholdsError};

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
    type Err = SparsityError;
    fn from_str(s: &str) -> Result<FfnMode, SparsityError> {
        match s {
            "dense" => Ok(FfnMode::Dense),
            "oracle" => Ok(FfnMode::Oracle),
            "topk" => Ok(FfnMode::TopK),
            _ => Err(SparsityError::UnknownMode(s.into())),
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
    type Err = SparsityError;
    fn from_str(s: &str) -> Result<Score, SparsityError> {
        match s {
            "glu" => Ok(Score::Glu),
            "gate" => Ok(Score::Gate),
            _ => Err(SparsityError::UnknownScore(s.into())),
        }
    }
}

/// A sparsity S: the fraction of neurons dropped, in [0, 1).
pub fn parse_sparsity(s: &str) -> Result<f32, SparsityError> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| SparsityError::NotANumber(s.into()))?;
    check_sparsity(v)?;
    Ok(v)
}

pub fn check_sparsity(v: f32) -> Result<(), SparsityError> {
    if !(0.0..1.0).contains(&v) {
        return Err(SparsityError::OutOfRange(v));
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
    type Err = SparsityError;
    fn from_str(s: &str) -> Result<BundleDown, SparsityError> {
        match s {
            "tiles" => Ok(BundleDown::Tiles),
            "q8" => Ok(BundleDown::AtLeast8Bit),
            "model" => Ok(BundleDown::Model),
            _ => Err(SparsityError::UnknownBundleDown(s.into())),
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
    pub fn check(&self, n_layers: usize) -> Result<(), SparsityError> {
        check_sparsity(self.sparsity)?;
        match self.mode {
            FfnMode::Oracle => match &self.thresholds {
                None => Err(SparsityError::NoThresholds),
                Some(t) if t.len() != n_layers => Err(SparsityError::ThresholdCount {
                    found: t.len(),
                    layers: n_layers,
                }),
                Some(t) if t.iter().any(|v| !v.is_finite() || *v < 0.0) => {
                    Err(SparsityError::BadThreshold)
                }
                Some(_) => Ok(()),
            },
            _ if self.dropped.is_some() => Err(SparsityError::DroppedWithoutThresholds),
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

/// Why sparsity options could not be parsed, checked or applied.
#[derive(Debug)]
pub enum SparsityError {
    /// `--ffn` names no mode.
    UnknownMode(String),
    /// `--score` names no score.
    UnknownScore(String),
    /// `--bundle-down` names no precision.
    UnknownBundleDown(String),
    /// `--thresholds` with a flash image, which carries its own table.
    ImageHasTable,
    /// Oracle mode on a flash image written without a thresholds table.
    ImageWithoutTable,
    /// A sparsity that does not parse as a number.
    NotANumber(String),
    /// A sparsity outside [0, 1).
    OutOfRange(f32),
    /// A list option (`--ffn`, `--score`, `--sparsity`) that names nothing.
    NoneGiven(&'static str),
    /// One configuration is needed (generate, the daemon) and the lists name this many.
    NotOne(usize),
    /// Oracle mode without thresholds.
    NoThresholds,
    /// Thresholds for another number of layers.
    ThresholdCount { found: usize, layers: usize },
    /// A threshold that is negative or not finite.
    BadThreshold,
    /// Dropped-neuron means outside oracle mode.
    DroppedWithoutThresholds,
    /// Dropped-neuron means of `mean` and `offset` values where the engine holds `want_mean`
    /// and `want_offset`.
    DroppedSize {
        mean: usize,
        offset: usize,
        want_mean: usize,
        want_offset: usize,
    },
    /// Sparse options for an engine booted dense (it has no bundles).
    BootedDense,
    /// Dense options for an engine booted sparse (it has no matrices).
    BootedSparse,
    /// The thresholds table could not be found, read or used.
    Thresholds(ThresholdsError),
}

impl fmt::Display for SparsityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SparsityError::UnknownMode(s) => {
                write!(f, "unknown FFN mode '{s}': expected dense, oracle or topk")
            }
            SparsityError::UnknownScore(s) => {
                write!(f, "unknown score '{s}': expected glu or gate")
            }
            SparsityError::ImageHasTable => write!(
                f,
                "a flash image carries the thresholds table it was written with: --thresholds cannot replace it"
            ),
            SparsityError::ImageWithoutTable => write!(
                f,
                "oracle mode needs thresholds, and this flash image was written without them (leanstream flash --thresholds)"
            ),
            SparsityError::UnknownBundleDown(s) => {
                write!(f, "unknown --bundle-down '{s}': expected tiles, q8 or model")
            }
            SparsityError::NotANumber(s) => write!(f, "sparsity '{s}' is not a number"),
            SparsityError::OutOfRange(v) => write!(f, "sparsity {v} is outside [0, 1)"),
            SparsityError::NoneGiven(what) => write!(f, "no {what} given"),
            SparsityError::NotOne(n) => write!(
                f,
                "give one --ffn, --score and --sparsity here ({n} configurations named)"
            ),
            SparsityError::NoThresholds => {
                write!(f, "oracle mode needs thresholds (leanstream calibrate)")
            }
            SparsityError::ThresholdCount { found, layers } => {
                write!(f, "{found} thresholds for a model of {layers} layers")
            }
            SparsityError::BadThreshold => {
                write!(f, "thresholds must be finite and non-negative")
            }
            SparsityError::DroppedWithoutThresholds => {
                write!(f, "dropped-neuron means go with thresholds (oracle mode)")
            }
            SparsityError::DroppedSize {
                mean,
                offset,
                want_mean,
                want_offset,
            } => write!(
                f,
                "dropped-neuron means of {mean} and {offset} values for {want_mean} and {want_offset}"
            ),
            SparsityError::BootedDense => write!(
                f,
                "this engine was booted dense; boot it with a sparse mode for bundles"
            ),
            SparsityError::BootedSparse => write!(
                f,
                "this engine was booted sparse (bundles); boot another for dense"
            ),
            SparsityError::Thresholds(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SparsityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SparsityError::Thresholds(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ThresholdsError> for SparsityError {
    fn from(e: ThresholdsError) -> Self {
        SparsityError::Thresholds(e)
    }
}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<SparsityError> for String {
    fn from(e: SparsityError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_scores_and_sparsities() {
        assert_eq!("oracle".parse::<FfnMode>().unwrap(), FfnMode::Oracle);
        let e = "sparse".parse::<FfnMode>().unwrap_err();
        assert!(matches!(&e, SparsityError::UnknownMode(m) if m == "sparse"));
        assert!(e.to_string().contains("dense, oracle or topk"), "{e}");
        assert_eq!("gate".parse::<Score>().unwrap(), Score::Gate);
        assert!(matches!(
            "relu".parse::<Score>(),
            Err(SparsityError::UnknownScore(_))
        ));
        assert!(matches!(
            "q2".parse::<BundleDown>(),
            Err(SparsityError::UnknownBundleDown(_))
        ));
        assert_eq!(parse_sparsity("0.5").unwrap(), 0.5);
        assert_eq!(parse_sparsity("0").unwrap(), 0.0);
        for bad in ["1", "1.5", "-0.1"] {
            assert!(
                matches!(parse_sparsity(bad), Err(SparsityError::OutOfRange(_))),
                "{bad}"
            );
        }
        // NaN parses as a number, and is outside [0, 1) like any other.
        assert!(matches!(
            parse_sparsity("NaN"),
            Err(SparsityError::OutOfRange(v)) if v.is_nan()
        ));
        assert!(matches!(
            parse_sparsity("x"),
            Err(SparsityError::NotANumber(s)) if s == "x"
        ));
    }

    #[test]
    fn oracle_needs_matching_thresholds() {
        let mut o = FfnOptions {
            mode: FfnMode::Oracle,
            sparsity: 0.5,
            ..Default::default()
        };
        let e = o.check(2).unwrap_err();
        assert!(matches!(e, SparsityError::NoThresholds));
        assert!(e.to_string().contains("calibrate"), "{e}");
        o.thresholds = Some(vec![0.1]);
        assert!(matches!(
            o.check(2),
            Err(SparsityError::ThresholdCount {
                found: 1,
                layers: 2
            })
        ));
        o.thresholds = Some(vec![0.1, f32::NAN]);
        assert!(matches!(o.check(2), Err(SparsityError::BadThreshold)));
        o.thresholds = Some(vec![0.1, 0.2]);
        o.check(2).unwrap();
        assert_eq!(o.label(), "oracle-glu-0.50");
        let topk = FfnOptions {
            mode: FfnMode::TopK,
            sparsity: 0.5,
            dropped: Some(DroppedMean::default()),
            ..Default::default()
        };
        assert!(matches!(
            topk.check(2),
            Err(SparsityError::DroppedWithoutThresholds)
        ));
    }
}
