//! The engine of the backend chosen at boot (`--backend cpu|cuda`), for the CLI and the daemon.

#[cfg(feature = "cuda")]
use super::cuda::CudaEngine;
use super::cuda_options::CudaOptions;
use super::{Arenas, Decoder, Engine, EngineError, EngineOptions};
use crate::board::MemoryModel;
use crate::kv::KvChoice;
use crate::model::ModelFile;

/// What `--backend cuda` answers in a build without the `cuda` feature.
pub const NO_CUDA: &str =
    "this build has no CUDA backend (built without the `cuda` feature; the default build has it)";

/// Whether this machine can run the CUDA backend: a GPU and its driver, in a build with the
/// `cuda` feature; otherwise [`EngineError::Gpu`], one sentence why not.
pub fn probe_cuda() -> Result<(), EngineError> {
    #[cfg(feature = "cuda")]
    {
        Ok(crate::backend::cuda::probe()?)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(EngineError::Gpu(NO_CUDA.into()))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
}

impl Backend {
    pub fn parse(s: &str) -> Result<Backend, EngineError> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "cuda" => Ok(Backend::Cuda),
            _ => Err(EngineError::UnknownBackend(s.into())),
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
pub fn parse_memory(s: &str) -> Result<MemoryModel, EngineError> {
    match s {
        "unified" => Ok(MemoryModel::Unified),
        "discrete" => Ok(MemoryModel::Discrete),
        _ => Err(EngineError::UnknownMemoryModel(s.into())),
    }
}

/// One per process, alive for the whole run: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyEngine<'a> {
    Cpu(Engine<'a>),
    #[cfg(feature = "cuda")]
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
                if cpu.ffn.mode != crate::sparsity::FfnMode::Dense && cpu.stream.is_none() {
                    return Err(EngineError::Options(
                        "the sparse FFN in memory runs on the CPU backend only; on the GPU it streams from a flash image (--image)".into(),
                    ));
                }
                let cuda = CudaOptions {
                    context: cpu.context,
                    precision: cpu.precision,
                    kv: match cpu.kv {
                        KvChoice::Auto => cuda.kv,
                        asked => asked,
                    },
                    ..cuda
                };
                Self::boot_cuda(arenas, model, cuda, &cpu)?
            }
        })
    }

    /// The GPU engine; with `cpu.stream`, its FFN streams from the flash image (`cpu.ffn`'s
    /// thresholds and dropped means).
    #[cfg(feature = "cuda")]
    fn boot_cuda(
        arenas: &'a mut Arenas,
        model: &ModelFile,
        cuda: CudaOptions,
        cpu: &EngineOptions,
    ) -> Result<AnyEngine<'a>, EngineError> {
        crate::backend::cuda::probe()?;
        Ok(AnyEngine::Cuda(match &cpu.stream {
            None => CudaEngine::boot(arenas, model, cuda)?,
            Some(stream) => CudaEngine::boot_streamed(
                arenas,
                model,
                cuda,
                crate::engine::cuda::StreamedBoot {
                    stream,
                    ffn: &cpu.ffn,
                },
            )?,
        }))
    }

    #[cfg(not(feature = "cuda"))]
    fn boot_cuda(
        _: &'a mut Arenas,
        _: &ModelFile,
        _: CudaOptions,
        _: &EngineOptions,
    ) -> Result<AnyEngine<'a>, EngineError> {
        Err(EngineError::Gpu(NO_CUDA.into()))
    }

    /// The CPU engine, when that is the backend (the sparse FFN's settings and counters).
    pub fn cpu(&mut self) -> Option<&mut Engine<'a>> {
        match self {
            AnyEngine::Cpu(e) => Some(e),
            #[cfg(feature = "cuda")]
            AnyEngine::Cuda(_) => None,
        }
    }

    pub fn decoder(&mut self) -> &mut (dyn Decoder + Send) {
        match self {
            AnyEngine::Cpu(e) => e,
            #[cfg(feature = "cuda")]
            AnyEngine::Cuda(e) => e,
        }
    }

    pub fn take_sample_buffer(&mut self) -> Option<&'a mut [u32]> {
        match self {
            AnyEngine::Cpu(e) => e.take_sample_buffer(),
            #[cfg(feature = "cuda")]
            AnyEngine::Cuda(e) => e.take_sample_buffer(),
        }
    }

    /// One line naming where the model runs.
    pub fn describe(&self) -> String {
        match self {
            AnyEngine::Cpu(e) => format!("cpu, {} threads", e.threads()),
            #[cfg(feature = "cuda")]
            AnyEngine::Cuda(e) => format!(
                "cuda {} (sm_{}{}), {} memory{}{}",
                e.gpu.name,
                e.gpu.compute_capability.0,
                e.gpu.compute_capability.1,
                match e.memory {
                    crate::board::MemoryModel::Unified => "unified",
                    _ => "discrete",
                },
                match e.precision {
                    crate::quant::Precision::Native => String::new(),
                    p => format!(", {p} weights, KV cache {}", e.kv_precision.name()),
                },
                match e.prefill_kernels() {
                    Some(k) => format!(", prefill: {k}"),
                    None => String::new(),
                }
            ),
        }
    }
}
