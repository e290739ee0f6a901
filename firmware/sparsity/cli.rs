//! The sparsity options shared by `leanstream` (generate, perplexity, bench) and `leanstreamd`.

use super::thresholds::{find_default, ThresholdTable, ThresholdsError};
use super::{parse_sparsity, BundleDown, FfnMode, FfnOptions, Score, SparsityError};
use crate::model::ModelFile;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug)]
pub struct SparsityArgs {
    /// FFN mode: dense (every neuron), oracle (neurons at or over the calibrated threshold), or
    /// topk (the 1-S largest per token). perplexity and bench take a comma-separated list.
    #[arg(long, default_value = "dense")]
    pub ffn: String,
    /// Fraction S of FFN neurons dropped, in [0, 1) (sparse modes). perplexity and bench take
    /// a comma-separated list.
    #[arg(long, default_value = "0.5")]
    pub sparsity: String,
    /// What ranks neurons: glu = |SiLU(gate) * up|, gate = |SiLU(gate)| (CATS; up only for kept
    /// neurons). perplexity and bench take a comma-separated list.
    #[arg(long, default_value = "glu")]
    pub score: String,
    /// Thresholds table for oracle mode, made by `leanstream calibrate` (default:
    /// `<model file stem>.thresh` in tables/ of the working directory, beside the model, or in the
    /// repository's tables/). A table given is checked against the model in every mode.
    #[arg(long)]
    pub thresholds: Option<PathBuf>,
    /// Precision of the bundles' down columns: tiles (32 columns with one scale per output
    /// row, added up in integers: a Q4_0/Q4_1 model's own 4-bit values, other types as int8),
    /// q8 (Q8_0 columns when the model's down matrix has fewer than 8 bits) or model (the
    /// model's own type: quantizes 4/5-bit columns a second time).
    #[arg(long, default_value = "tiles")]
    pub bundle_down: String,
    /// Oracle mode: count each dropped neuron with its mean activation when dropped, as
    /// calibrated in the thresholds' table (on), or as zero (off).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub dropped_mean: String,
}

fn list<T>(
    s: &str,
    what: &'static str,
    parse: impl Fn(&str) -> Result<T, SparsityError>,
) -> Result<Vec<T>, SparsityError> {
    let v: Vec<T> = s
        .split(',')
        .map(|p| parse(p.trim()))
        .collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err(SparsityError::NoneGiven(what));
    }
    Ok(v)
}

impl SparsityArgs {
    /// Every configuration the lists name: each mode, and for sparse modes each score and
    /// sparsity (dense once). Thresholds are read only when a mode needs them.
    pub fn configs(
        &self,
        model_path: &Path,
        model: &ModelFile,
    ) -> Result<Vec<FfnOptions>, SparsityError> {
        let modes = list(&self.ffn, "--ffn mode", |s| s.parse::<FfnMode>())?;
        let scores = list(&self.score, "--score", |s| s.parse::<Score>())?;
        let sparsities = list(&self.sparsity, "--sparsity", parse_sparsity)?;
        let bundle_down: BundleDown = self.bundle_down.parse()?;
        // A table given is checked against the model whatever the modes (dense and topk do not
        // use it, but a wrong one is a mistake to say, not to ignore).
        let image = crate::model::flash::is_flash_image(model_path);
        let mut table: Option<ThresholdTable> = match &self.thresholds {
            // A flash image carries the table it was written with: that one, or none.
            Some(_) if image => return Err(SparsityError::ImageHasTable),
            None if image => {
                let h = model.hyper().map_err(ThresholdsError::Model)?;
                crate::model::flash::FlashImage::open(model_path)
                    .ok()
                    .map(|i| ThresholdTable::from_image(&i, &h))
                    .transpose()?
                    .flatten()
            }
            Some(path) if !path.is_file() => {
                return Err(ThresholdsError::Missing {
                    path: path.clone(),
                    model: model_path.to_path_buf(),
                }
                .into())
            }
            Some(path) => Some(ThresholdTable::load(path, model)?),
            None => None,
        };
        let mut out = Vec::new();
        for mode in modes {
            if mode == FfnMode::Dense {
                out.push(FfnOptions::default());
                continue;
            }
            for &score in &scores {
                for &sparsity in &sparsities {
                    let mut dropped = None;
                    let thresholds = if mode == FfnMode::Oracle {
                        if table.is_none() && image {
                            return Err(SparsityError::ImageWithoutTable);
                        }
                        if table.is_none() {
                            let path = find_default(model_path)?;
                            table = Some(ThresholdTable::load(&path, model)?);
                        }
                        let table = table.as_ref().unwrap();
                        if self.dropped_mean == "on" {
                            dropped = Some(table.dropped_mean(sparsity, score)?);
                        }
                        Some(table.thresholds(sparsity, score)?)
                    } else {
                        None
                    };
                    out.push(FfnOptions {
                        mode,
                        score,
                        sparsity,
                        thresholds,
                        bundle_down,
                        dropped,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Exactly one configuration (generate, the daemon).
    pub fn single(
        &self,
        model_path: &Path,
        model: &ModelFile,
    ) -> Result<FfnOptions, SparsityError> {
        let mut c = self.configs(model_path, model)?;
        if c.len() != 1 {
            return Err(SparsityError::NotOne(c.len()));
        }
        Ok(c.pop().unwrap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::tiny;
    use crate::sparsity::thresholds::tests::table;
    use crate::tables::TableError;

    fn args(ffn: &str, sparsity: &str, thresholds: Option<PathBuf>) -> SparsityArgs {
        SparsityArgs {
            ffn: ffn.into(),
            sparsity: sparsity.into(),
            score: "glu".into(),
            thresholds,
            bundle_down: "tiles".into(),
            dropped_mean: "on".into(),
        }
    }

    /// A bad spec is refused as what it is: a sparsity out of range, a table that is not
    /// there, one made for another model, several configurations where one is needed.
    #[test]
    fn bad_specs_are_refused_as_what_they_are() {
        let dir = std::env::temp_dir().join(format!("leanstream-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model_path = dir.join("tiny-without-table.gguf");
        let model = ModelFile::from_bytes(tiny("llama", false, true).build()).unwrap();

        let e = args("topk", "0.5, 1.5", None)
            .configs(&model_path, &model)
            .unwrap_err();
        assert!(matches!(e, SparsityError::OutOfRange(v) if v == 1.5), "{e}");
        assert!(matches!(
            args("topk,dense", "0.5", None).single(&model_path, &model),
            Err(SparsityError::NotOne(2))
        ));
        assert_eq!(
            args("topk,dense", "0.5,0.7", None)
                .configs(&model_path, &model)
                .unwrap()
                .len(),
            3
        );

        let absent = dir.join("absent.thresh");
        let e = args("oracle", "0.5", Some(absent.clone()))
            .configs(&model_path, &model)
            .unwrap_err();
        assert!(
            matches!(&e, SparsityError::Thresholds(ThresholdsError::Missing { path, .. }) if path == &absent),
            "{e}"
        );
        let e = args("oracle", "0.5", None)
            .configs(&model_path, &model)
            .unwrap_err();
        assert!(
            matches!(
                e,
                SparsityError::Thresholds(ThresholdsError::NotFound { .. })
            ),
            "{e}"
        );

        // A table given is checked against the model even where the mode does not use it.
        // `tiny`: 1 layer, width 8, 12 neurons.
        let other = ModelFile::from_bytes(tiny("qwen2", true, false).build()).unwrap();
        let path = dir.join("qwen.thresh");
        table(1, 12, 8).save(&path, &other).unwrap();
        let e = args("topk", "0.5", Some(path))
            .configs(&model_path, &model)
            .unwrap_err();
        assert!(
            matches!(
                &e,
                SparsityError::Thresholds(ThresholdsError::Table {
                    source: TableError::OtherModel { .. },
                    ..
                })
            ),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
