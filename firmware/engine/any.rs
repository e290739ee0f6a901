//! The engine of the backend chosen at boot (`--backend cpu|cuda`), for the CLI and the daemon.

use super::cuda::{CudaEngine, CudaOptions};
use super::{Arenas, Decoder, Engine, EngineError, EngineOptions};
use crate::board::MemoryModel;
use crate::model::ModelFile;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
}

impl Backend {
    pub fn parse(s: &str) -> Result<Backend, String> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "cuda" => Ok(Backend::Cuda),
            _ => Err(format!("unknown backend '{s}' (cpu or cuda)")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// `--memory unified|discrete` for the CUDA backend.
pub fn parse_memory(s: &str) -> Result<MemoryModel, String> {
    match s {
        "unified" => Ok(MemoryModel::Unified),
        "discrete" => Ok(MemoryModel::Discrete),
        _ => Err(format!("unknown memory model '{s}' (unified or discrete)")),
    }
}

/// One per process, alive for the whole run: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyEngine<'a> {
    Cpu(Engine<'a>),
    Cuda(CudaEngine<'a>),
}

impl<'a> AnyEngine<'a> {
    /// Boots `model` on `backend`. For CUDA, `cpu.precision` f16 converts the weights; w8a8,
    /// w4a8, a sparse FFN (`cpu.ffn`), or a machine without a GPU or driver, is refused with one
    /// sentence before anything is placed.
    pub fn boot(
        arenas: &'a mut Arenas,
        model: &ModelFile,
        backend: Backend,
        cpu: EngineOptions,
        cuda: CudaOptions,
    ) -> Result<AnyEngine<'a>, EngineError> {
        Ok(match backend {
            Backend::Cpu => AnyEngine::Cpu(Engine::boot(arenas, model, cpu)?),
            Backend::Cuda => {
                if cpu.ffn.mode != crate::sparsity::FfnMode::Dense {
                    return Err(EngineError::Options(
                        "the sparse FFN runs on the CPU backend only for now".into(),
                    ));
                }
                crate::backend::cuda::probe().map_err(EngineError::Gpu)?;
                let cuda = CudaOptions {
                    context: cpu.context,
                    precision: cpu.precision,
                    f32_kv: cpu.f32_kv || cuda.f32_kv,
                    ..cuda
                };
                AnyEngine::Cuda(CudaEngine::boot(arenas, model, cuda)?)
            }
        })
    }

    pub fn decoder(&mut self) -> &mut (dyn Decoder + Send) {
        match self {
            AnyEngine::Cpu(e) => e,
            AnyEngine::Cuda(e) => e,
        }
    }

    pub fn take_sample_buffer(&mut self) -> Option<&'a mut [u32]> {
        match self {
            AnyEngine::Cpu(e) => e.take_sample_buffer(),
            AnyEngine::Cuda(e) => e.take_sample_buffer(),
        }
    }

    /// One line naming where the model runs.
    pub fn describe(&self) -> String {
        match self {
            AnyEngine::Cpu(e) => format!("cpu, {} threads", e.threads()),
            AnyEngine::Cuda(e) => format!(
                "cuda {} (sm_{}{}), {} memory{}",
                e.gpu.name,
                e.gpu.compute_capability.0,
                e.gpu.compute_capability.1,
                match e.memory {
                    crate::board::MemoryModel::Unified => "unified",
                    _ => "discrete",
                },
                match e.precision {
                    crate::quant::Precision::Native => String::new(),
                    p => format!(
                        ", {p} weights, KV cache {}",
                        if e.int8_kv { "int8" } else { "f32" }
                    ),
                }
            ),
        }
    }
}
