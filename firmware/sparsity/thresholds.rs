//! Calibrated thresholds: for each layer, the value of |SiLU(gate) * up| (score `glu`) or
//! |SiLU(gate)| (score `gate`, as in CATS) under which a fraction S of the layer's neurons fall,
//! on average over the calibration tokens. `leanstream calibrate` runs the dense model over a
//! text, fills one histogram per layer and score, and writes every asked-for S into one table
//! file (kind "thresh", postcard, format version, model identity, checksum: `crate::tables`).
//!
//! Dropped-neuron means: with the thresholds set, a second pass over the same tokens records,
//! per level, score, layer and neuron, the mean activation SiLU(gate) * up of the neuron over
//! the tokens where it fell under the threshold, and the layer's `offset` = down x those means.
//! The sparse FFN then adds the kept neurons' `h - mean` and the offset: the dropped neurons
//! count with their mean activation instead of zero, at the cost of one subtraction per kept
//! neuron and one addition per output (`bundle::SparseFfn::forward`). It uses only which
//! neurons were dropped, so a predictor that never computes them can use it as well.
//!
//! Histograms: 65,536 bins over the bit pattern of the magnitude (sign dropped, low 15 bits of
//! the mantissa dropped), so each bin spans 2^-8 of its value; the threshold is interpolated
//! linearly inside the bin where the count crosses S. S = 0 gives threshold 0 (every neuron).

use super::Score;
use crate::model::{FormatError, ModelFile};
use crate::tables::{self, TableError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

pub const KIND: &str = "thresh";
/// 2: levels carry the dropped-neuron means and offsets.
pub const VERSION: u32 = 2;

/// The thresholds of every calibrated sparsity for one model.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ThresholdTable {
    pub n_layers: u32,
    pub hidden: u32,
    /// What the thresholds were calibrated on (file, tokens skipped, tokens used, window).
    pub calibration: String,
    pub tokens: u64,
    pub levels: Vec<ThresholdLevel>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ThresholdLevel {
    pub sparsity: f32,
    /// Per layer, on |SiLU(gate) * up|.
    pub glu: Vec<f32>,
    /// Per layer, on |SiLU(gate)|.
    pub gate: Vec<f32>,
    /// The dropped-neuron means for each score: `[layer][neuron]` and `[layer][output]`.
    pub glu_dropped: DroppedMean,
    pub gate_dropped: DroppedMean,
}

/// What the neurons a threshold drops contribute on average (see the module's comment).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct DroppedMean {
    /// Per layer and neuron: the mean of SiLU(gate) * up over the calibration tokens where the
    /// neuron's score fell under the layer's threshold (0 if it never did).
    pub mean: Vec<f32>,
    /// Per layer and output: down x `mean`.
    pub offset: Vec<f32>,
}

/// Why a thresholds table could not be found, read, written or used.
#[derive(Debug)]
pub enum ThresholdsError {
    /// None was given and none is at the default places (`looked`, in order).
    NotFound {
        model: PathBuf,
        looked: Vec<PathBuf>,
    },
    /// The table given (`--thresholds`) is not a file.
    Missing { path: PathBuf, model: PathBuf },
    /// The folder to write the table in could not be made.
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The file could not be read or written, or is not a thresholds table of this model.
    Table { path: PathBuf, source: TableError },
    /// The model's hyperparameters could not be read.
    Model(FormatError),
    /// The table's shapes are not the model's `layers` layers of `neurons` neurons.
    Mismatch {
        path: PathBuf,
        layers: usize,
        neurons: usize,
    },
    /// The table has no level at `sparsity`; it has `have`.
    NoLevel { sparsity: f32, have: Vec<f32> },
}

impl fmt::Display for ThresholdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdsError::NotFound { model, looked } => {
                let m = model.display();
                let looked: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "no thresholds table for {m} (looked for {}); make one with `leanstream calibrate --model {m} --file TEXT --sparsity S`, or give --thresholds",
                    looked.join(", ")
                )
            }
            ThresholdsError::Missing { path, model } => write!(
                f,
                "{}: thresholds table not found (make one with `leanstream calibrate --model {} --file TEXT --sparsity S`)",
                path.display(),
                model.display()
            ),
            ThresholdsError::CreateDir { dir, source } => {
                write!(f, "{}: {source}", dir.display())
            }
            // An I/O error names the file already.
            ThresholdsError::Table {
                source: source @ TableError::Io { .. },
                ..
            } => write!(f, "{source}"),
            ThresholdsError::Table { path, source } => write!(f, "{}: {source}", path.display()),
            ThresholdsError::Model(e) => write!(f, "{e}"),
            ThresholdsError::Mismatch {
                path,
                layers,
                neurons,
            } => write!(
                f,
                "{}: thresholds do not match the model's {layers} layers of {neurons} neurons",
                path.display()
            ),
            ThresholdsError::NoLevel { sparsity, have } => {
                let have: Vec<String> = have.iter().map(|s| format!("{s}")).collect();
                write!(
                    f,
                    "no thresholds for sparsity {sparsity} (the table has {}): run leanstream calibrate --sparsity {sparsity}",
                    have.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for ThresholdsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ThresholdsError::CreateDir { source, .. } => Some(source),
            ThresholdsError::Table { source, .. } => Some(source),
            ThresholdsError::Model(e) => Some(e),
            _ => None,
        }
    }
}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<ThresholdsError> for String {
    fn from(e: ThresholdsError) -> String {
        e.to_string()
    }
}

/// `tables/<model file stem>.thresh`: where `calibrate` writes and the other commands look.
pub fn default_path(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    PathBuf::from("tables").join(format!("{stem}.thresh"))
}

/// Where a model's thresholds table is looked for when none is given, in order: `tables/` in the
/// working directory (where `calibrate` writes by default), beside the model, and the
/// repository's `tables/` (found from the executable, `<repo>/target/<profile>/<bin>`, or the
/// source tree the binary was built from).
pub fn default_candidates(model: &Path) -> Vec<PathBuf> {
    let name = default_path(model);
    let name = name.file_name().unwrap_or_default();
    let mut v = vec![default_path(model)];
    if let Some(dir) = model.parent() {
        v.push(dir.join(name));
    }
    if let Some(repo) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent()?.parent().map(Path::to_path_buf))
        .filter(|r| r.join("Cargo.toml").is_file())
    {
        v.push(repo.join("tables").join(name));
    }
    v.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tables")
            .join(name),
    );
    let mut seen = Vec::new();
    v.retain(|p| {
        let key = p.canonicalize().unwrap_or_else(|_| p.clone());
        let fresh = !seen.contains(&key);
        seen.push(key);
        fresh
    });
    v
}

/// The first of [`default_candidates`] that exists; else an error that names every place looked
/// at and how to make the table.
pub fn find_default(model: &Path) -> Result<PathBuf, ThresholdsError> {
    let candidates = default_candidates(model);
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    Err(ThresholdsError::NotFound {
        model: model.to_path_buf(),
        looked: candidates,
    })
}

impl ThresholdTable {
    pub fn save(&self, path: &Path, model: &ModelFile) -> Result<(), ThresholdsError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| ThresholdsError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        tables::write(path, KIND, VERSION, tables::model_identity(model), self).map_err(|source| {
            ThresholdsError::Table {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// Loads a table made for `model`; another model's table, or a damaged one, is refused.
    pub fn load(path: &Path, model: &ModelFile) -> Result<ThresholdTable, ThresholdsError> {
        let t: ThresholdTable = tables::read(path, KIND, VERSION, tables::model_identity(model))
            .map_err(|source| ThresholdsError::Table {
                path: path.to_path_buf(),
                source,
            })?;
        let h = model.hyper().map_err(ThresholdsError::Model)?;
        t.checked(path, &h)
    }

    /// The table a flash image carries (`leanstream flash --thresholds`), checked against the
    /// image's key and the model's shape `h`; None when the image has none.
    pub fn from_image(
        image: &crate::model::flash::FlashImage,
        h: &crate::model::Hyper,
    ) -> Result<Option<ThresholdTable>, ThresholdsError> {
        let Some(bytes) = image.thresholds_bytes() else {
            return Ok(None);
        };
        let path = image.path().map(Path::to_path_buf).unwrap_or_default();
        let t: ThresholdTable = tables::decode(bytes, KIND, VERSION, image.header.tables_identity)
            .map_err(|source| ThresholdsError::Table {
                path: path.clone(),
                source,
            })?;
        t.checked(&path, h).map(Some)
    }

    /// `self`, when its shapes are `h`'s.
    fn checked(
        self,
        path: &Path,
        h: &crate::model::Hyper,
    ) -> Result<ThresholdTable, ThresholdsError> {
        let t = self;
        let dropped_ok = |d: &DroppedMean| {
            d.mean.len() == h.n_layers * h.hidden_dim
                && d.offset.len() == h.n_layers * h.dim
                && d.mean.iter().chain(&d.offset).all(|v| v.is_finite())
        };
        let bad = t.n_layers as usize != h.n_layers
            || t.hidden as usize != h.hidden_dim
            || t.levels.iter().any(|l| {
                l.glu.len() != h.n_layers
                    || l.gate.len() != h.n_layers
                    || !dropped_ok(&l.glu_dropped)
                    || !dropped_ok(&l.gate_dropped)
            });
        if bad {
            return Err(ThresholdsError::Mismatch {
                path: path.to_path_buf(),
                layers: h.n_layers,
                neurons: h.hidden_dim,
            });
        }
        Ok(t)
    }

    /// The per-layer thresholds for `score` at `sparsity` (calibrated to within 1e-4).
    pub fn thresholds(&self, sparsity: f32, score: Score) -> Result<Vec<f32>, ThresholdsError> {
        let l = self.level(sparsity)?;
        Ok(match score {
            Score::Glu => l.glu.clone(),
            Score::Gate => l.gate.clone(),
        })
    }

    /// The dropped-neuron means for `score` at `sparsity`.
    pub fn dropped_mean(
        &self,
        sparsity: f32,
        score: Score,
    ) -> Result<DroppedMean, ThresholdsError> {
        let l = self.level(sparsity)?;
        Ok(match score {
            Score::Glu => l.glu_dropped.clone(),
            Score::Gate => l.gate_dropped.clone(),
        })
    }

    fn level(&self, sparsity: f32) -> Result<&ThresholdLevel, ThresholdsError> {
        self.levels
            .iter()
            .find(|l| (l.sparsity - sparsity).abs() < 1e-4)
            .ok_or_else(|| ThresholdsError::NoLevel {
                sparsity,
                have: self.levels.iter().map(|l| l.sparsity).collect(),
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::tests::tiny;

    /// A table of one level (sparsity 0.5) for a model of these shapes.
    pub(crate) fn table(n_layers: usize, hidden: usize, dim: usize) -> ThresholdTable {
        let dropped = DroppedMean {
            mean: vec![0.0; n_layers * hidden],
            offset: vec![0.0; n_layers * dim],
        };
        ThresholdTable {
            n_layers: n_layers as u32,
            hidden: hidden as u32,
            calibration: String::new(),
            tokens: 0,
            levels: vec![ThresholdLevel {
                sparsity: 0.5,
                glu: vec![0.1; n_layers],
                gate: vec![0.2; n_layers],
                glu_dropped: dropped.clone(),
                gate_dropped: dropped,
            }],
        }
    }

    #[test]
    fn missing_levels_are_named() {
        let t = table(1, 4, 2);
        assert_eq!(t.thresholds(0.5, Score::Gate).unwrap(), vec![0.2]);
        let e = t.thresholds(0.7, Score::Glu).unwrap_err();
        assert!(
            matches!(&e, ThresholdsError::NoLevel { sparsity, have } if *sparsity == 0.7 && have == &[0.5]),
            "{e}"
        );
        let m = e.to_string();
        assert!(
            m.contains("sparsity 0.7") && m.contains("0.5") && m.contains("calibrate"),
            "{m}"
        );
    }

    /// Another model's table, a table of other shapes, and a file that is not there are each
    /// refused as what they are; the I/O error stays the source.
    #[test]
    fn tables_for_another_model_or_shape_are_refused() {
        let dir = std::env::temp_dir().join(format!("leanstream-thresh-{}", std::process::id()));
        let llama = ModelFile::from_bytes(tiny("llama", false, true).build()).unwrap();
        let qwen = ModelFile::from_bytes(tiny("qwen2", true, false).build()).unwrap();
        // `tiny`: 1 layer, width 8, 12 neurons.
        let good = table(1, 12, 8);
        let path = dir.join("tiny.thresh");
        good.save(&path, &llama).unwrap();
        assert_eq!(ThresholdTable::load(&path, &llama).unwrap(), good);

        let e = ThresholdTable::load(&path, &qwen).unwrap_err();
        assert!(
            matches!(
                &e,
                ThresholdsError::Table { path: p, source: TableError::OtherModel { .. } } if p == &path
            ),
            "{e}"
        );
        assert!(
            e.to_string().starts_with(&format!("{}: ", path.display())),
            "{e}"
        );

        let wide = dir.join("wide.thresh");
        table(1, 16, 8).save(&wide, &llama).unwrap();
        assert!(matches!(
            ThresholdTable::load(&wide, &llama),
            Err(ThresholdsError::Mismatch {
                layers: 1,
                neurons: 12,
                ..
            })
        ));

        let absent = dir.join("absent.thresh");
        let e = ThresholdTable::load(&absent, &llama).unwrap_err();
        assert!(
            matches!(
                &e,
                ThresholdsError::Table {
                    source: TableError::Io { .. },
                    ..
                }
            ),
            "{e}"
        );
        // The I/O error names the file once, and is kept, not flattened.
        assert_eq!(
            e.to_string()
                .matches(&*absent.display().to_string())
                .count(),
            1,
            "{e}"
        );
        let io = std::error::Error::source(&e)
            .and_then(std::error::Error::source)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the io::Error is the source's source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
