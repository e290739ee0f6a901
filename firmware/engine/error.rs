//! Why an engine could not boot, or refused what it was asked: one enum for both backends.

use super::stream_predict::PredictorBootError;
use crate::boot::BootError;
use crate::model::FormatError;
use crate::sparsity::{BundleError, SparsityError};
use crate::stream::StreamError;
use std::fmt;

/// Why an engine could not boot, or refused what it was asked.
#[derive(Debug)]
pub enum EngineError {
    Format(FormatError),
    Boot(BootError),
    /// A model this engine cannot run (a shape or type it does not support).
    Unsupported(String),
    /// A model whose FFN the bundles cannot hold (sparse modes).
    Bundles(BundleError),
    /// The GPU could not run it: no GPU or driver here (one sentence why), or a CUDA call failed.
    Gpu(String),
    /// Options that cannot be used together (traces of a sparse engine, ...).
    Options(String),
    /// Sparsity options that cannot be used (sparsity out of range, missing thresholds, ...).
    Sparsity(SparsityError),
    /// `--backend` names no backend.
    UnknownBackend(String),
    /// `--memory` names no memory model.
    UnknownMemoryModel(String),
    /// The exact down product (calibration) was asked of an engine without the model's own
    /// dense matrices.
    ExactDownNeedsDense,
    /// The flash image cannot be streamed from (unreadable, another model or board).
    Flash(crate::model::flash::FlashError),
    /// The streamed FFN could not be set up (the lanes, the cache, the budget).
    Stream(super::StreamBootError),
    /// An FFN block could not be read: the request it was read for ends.
    Read(crate::stream::ReadError),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Format(e) => write!(f, "{e}"),
            EngineError::Boot(e) => write!(f, "{e}"),
            EngineError::Unsupported(m) => write!(f, "unsupported model: {m}"),
            EngineError::Bundles(e) => write!(f, "unsupported model: {e}"),
            EngineError::Gpu(m) => write!(f, "{m}"),
            EngineError::Options(m) => write!(f, "{m}"),
            EngineError::Sparsity(e) => write!(f, "{e}"),
            EngineError::UnknownBackend(s) => write!(f, "unknown backend '{s}' (cpu or cuda)"),
            EngineError::UnknownMemoryModel(s) => {
                write!(f, "unknown memory model '{s}' (unified or discrete)")
            }
            EngineError::Flash(e) => write!(f, "{e}"),
            EngineError::Stream(e) => write!(f, "{e}"),
            EngineError::Read(e) => write!(f, "the FFN stream from the flash image failed: {e}"),
            EngineError::ExactDownNeedsDense => write!(
                f,
                "the exact down product needs a dense engine at the model's own precision"
            ),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Format(e) => Some(e),
            EngineError::Boot(e) => Some(e),
            EngineError::Bundles(e) => Some(e),
            EngineError::Sparsity(e) => Some(e),
            EngineError::Flash(e) => Some(e),
            EngineError::Stream(e) => Some(e),
            EngineError::Read(e) => Some(e),
            _ => None,
        }
    }
}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<EngineError> for String {
    fn from(e: EngineError) -> String {
        e.to_string()
    }
}

impl From<SparsityError> for EngineError {
    fn from(e: SparsityError) -> Self {
        EngineError::Sparsity(e)
    }
}

/// A short arena is the arena's refusal; the rest is the model's shape.
impl From<BundleError> for EngineError {
    fn from(e: BundleError) -> Self {
        match e {
            BundleError::Arena(b) => EngineError::Boot(b),
            e => EngineError::Bundles(e),
        }
    }
}

impl From<FormatError> for EngineError {
    fn from(e: FormatError) -> Self {
        EngineError::Format(e)
    }
}

impl From<BootError> for EngineError {
    fn from(e: BootError) -> Self {
        EngineError::Boot(e)
    }
}

/// The GPU's refusal is one sentence, the same in builds with and without the `cuda` feature.
#[cfg(feature = "cuda")]
impl From<crate::backend::cuda::GpuError> for EngineError {
    fn from(e: crate::backend::cuda::GpuError) -> Self {
        EngineError::Gpu(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::any::Backend;
    use crate::engine::{Engine, EngineOptions};
    use crate::model::tests::tiny;
    use crate::model::ModelFile;
    use crate::sparsity::{FfnMode, FfnOptions};

    /// A sparse boot of a model the bundles cannot hold, and sparsity options out of range,
    /// are refused as such before any arena is touched, with the sentences users see.
    #[test]
    fn sparse_boot_refusals_keep_their_kind() {
        // `tiny`: width 8, not a multiple of the bundles' 32.
        let model = ModelFile::from_bytes(tiny("llama", false, true).build()).unwrap();
        let topk = |sparsity| EngineOptions {
            ffn: FfnOptions {
                mode: FfnMode::TopK,
                sparsity,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = Engine::plan(&model, &topk(0.5)).unwrap_err();
        assert!(
            matches!(e, EngineError::Bundles(BundleError::Width(8))),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "unsupported model: bundles need a model width that is a multiple of 32, not 8"
        );
        let e = Engine::plan(&model, &topk(1.5)).unwrap_err();
        assert!(
            matches!(e, EngineError::Sparsity(SparsityError::OutOfRange(v)) if v == 1.5),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
        Engine::plan(&model, &EngineOptions::default()).unwrap();

        let e = Backend::parse("tpu").unwrap_err();
        assert!(matches!(&e, EngineError::UnknownBackend(b) if b == "tpu"));
        assert_eq!(e.to_string(), "unknown backend 'tpu' (cpu or cuda)");
    }
}

/// Why the streamed FFN could not be set up.
#[derive(Debug)]
pub enum StreamBootError {
    Stream(StreamError),
    Boot(BootError),
    /// The `hot` policy on an image without a profile.
    NoProfile,
    Predictor(PredictorBootError),
    /// The controller's LUT (`--controller`) could not be loaded or does not fit.
    Controller {
        path: std::path::PathBuf,
        error: crate::control::LutError,
    },
    /// The budget buys fewer slots than the largest layer's blocks (plus the pinned hot ones).
    TooSmall {
        slots: usize,
        largest: usize,
        in_flight: usize,
        hot: usize,
    },
}

impl From<StreamError> for StreamBootError {
    fn from(e: StreamError) -> Self {
        StreamBootError::Stream(e)
    }
}

impl From<PredictorBootError> for StreamBootError {
    fn from(e: PredictorBootError) -> Self {
        StreamBootError::Predictor(e)
    }
}

impl From<BootError> for StreamBootError {
    fn from(e: BootError) -> Self {
        StreamBootError::Boot(e)
    }
}

impl std::fmt::Display for StreamBootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamBootError::Stream(e) => write!(f, "{e}"),
            StreamBootError::Boot(e) => write!(f, "{e}"),
            StreamBootError::Predictor(e) => write!(f, "{e}"),
            StreamBootError::Controller { path, error } => {
                write!(f, "--controller {}: {error}", path.display())
            }
            StreamBootError::NoProfile => write!(
                f,
                "--cache hot pins the blocks a profile used most, and this flash image has none (write it with leanstream flash --trace)"
            ),
            StreamBootError::TooSmall {
                slots,
                largest,
                in_flight,
                hot,
            } => write!(
                f,
                "--ffn-budget buys {slots} cache blocks, but a layer needs up to {largest} beside {in_flight} reads in flight{}: raise --ffn-budget",
                if *hot > 0 {
                    format!(" beside {hot} pinned hot blocks")
                } else {
                    String::new()
                }
            ),
        }
    }
}

impl std::error::Error for StreamBootError {}
