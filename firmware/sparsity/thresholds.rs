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
use crate::model::ModelFile;
use crate::tables;
use serde::{Deserialize, Serialize};
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
    /// The dropped-neuron means for each score: [layer][neuron] and [layer][output].
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
pub fn find_default(model: &Path) -> Result<PathBuf, String> {
    let candidates = default_candidates(model);
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "no thresholds table for {} (looked for {}); make one with `leanstream calibrate --model {} --file TEXT --sparsity S`, or give --thresholds",
        model.display(),
        looked.join(", "),
        model.display()
    ))
}

impl ThresholdTable {
    pub fn save(&self, path: &Path, model: &ModelFile) -> Result<(), String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        tables::write(path, KIND, VERSION, tables::model_identity(model), self)
            .map_err(|e| e.to_string())
    }

    /// Loads a table made for `model`; another model's table, or a damaged one, is refused.
    pub fn load(path: &Path, model: &ModelFile) -> Result<ThresholdTable, String> {
        let t: ThresholdTable = tables::read(path, KIND, VERSION, tables::model_identity(model))
            .map_err(|e| match e {
                // It names the file already.
                tables::TableError::Io(_) => e.to_string(),
                _ => format!("{}: {e}", path.display()),
            })?;
        let h = model.hyper().map_err(|e| e.to_string())?;
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
            return Err(format!(
                "{}: thresholds do not match the model's {} layers of {} neurons",
                path.display(),
                h.n_layers,
                h.hidden_dim
            ));
        }
        Ok(t)
    }

    /// The per-layer thresholds for `score` at `sparsity` (calibrated to within 1e-4).
    pub fn thresholds(&self, sparsity: f32, score: Score) -> Result<Vec<f32>, String> {
        let l = self.level(sparsity)?;
        Ok(match score {
            Score::Glu => l.glu.clone(),
            Score::Gate => l.gate.clone(),
        })
    }

    /// The dropped-neuron means for `score` at `sparsity`.
    pub fn dropped_mean(&self, sparsity: f32, score: Score) -> Result<DroppedMean, String> {
        let l = self.level(sparsity)?;
        Ok(match score {
            Score::Glu => l.glu_dropped.clone(),
            Score::Gate => l.gate_dropped.clone(),
        })
    }

    fn level(&self, sparsity: f32) -> Result<&ThresholdLevel, String> {
        self
            .levels
            .iter()
            .find(|l| (l.sparsity - sparsity).abs() < 1e-4)
            .ok_or_else(|| {
                let have: Vec<String> =
                    self.levels.iter().map(|l| format!("{}", l.sparsity)).collect();
                format!(
                    "no thresholds for sparsity {sparsity} (the table has {}): run leanstream calibrate --sparsity {sparsity}",
                    have.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_levels_are_named() {
        let t = ThresholdTable {
            n_layers: 1,
            hidden: 4,
            calibration: String::new(),
            tokens: 0,
            levels: vec![ThresholdLevel {
                sparsity: 0.5,
                glu: vec![0.1],
                gate: vec![0.2],
                glu_dropped: DroppedMean::default(),
                gate_dropped: DroppedMean::default(),
            }],
        };
        assert_eq!(t.thresholds(0.5, Score::Gate).unwrap(), vec![0.2]);
        let e = t.thresholds(0.7, Score::Glu).unwrap_err();
        assert!(
            e.contains("sparsity 0.7") && e.contains("0.5") && e.contains("calibrate"),
            "{e}"
        );
    }
}
