//! CUDA backend: the decode step as kernels loaded from the committed PTX (kernels-ptx/), run
//! through cudarc's driver bindings with dynamic loading, so building needs no CUDA and a
//! machine without a GPU gets one clear sentence (`driver::probe`).
//!
//! - `driver`: the checked driver calls (memory, modules, launches, graphs, events).
//! - `weights`: GGUF tensors repacked into the kernels' layout (same values).
//! - `engine`: `CudaEngine`, the forward pass as one CUDA graph per token.
//! - `flags`: 32-bit flags in mapped host memory shared by CPU threads and running kernels.

pub mod driver;
pub mod engine;
pub mod flags;
pub mod weights;

pub use driver::probe;
pub use engine::{CudaEngine, CudaOptions, DependentLaunch, InBlockNorm, ProductKernels};

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
