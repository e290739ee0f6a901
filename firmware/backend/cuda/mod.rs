//! CUDA backend: the decode step as kernels loaded from the committed PTX (kernels-ptx/), run
//! through cudarc's driver bindings with dynamic loading, so building needs no CUDA and a
//! machine without a GPU gets one clear sentence (`driver::probe`).
//!
//! - `driver`: the checked driver calls (memory, modules, launches, graphs, events).
//! - `blas`: cuBLAS loaded at run time, for the batched prefill's products.
//! - `weights`: GGUF tensors repacked into the kernels' layout (same values).
//! - `kquant`: the K-quants' super-blocks in that layout (same bytes).
//! - `ptx_for`: the committed PTX module for a GPU's compute capability.
//!
//! The CUDA decoder that drives these kernels is `crate::engine::cuda` (the engine layer).
//! - `flags`: 32-bit flags in mapped host memory shared by CPU threads and running kernels.
//! - `stream_ffn`: the persistent streaming-FFN kernel (flag-driven) and its launcher.
//! - `stream_layer`: that kernel fed by the I/O lanes from a flash image, block by block as
//!   reads land, with per-stage updates for the next layer's reads (Algorithm 1).

pub mod blas;
pub mod driver;
pub mod flags;
pub mod kquant;
pub mod stream_ffn;
pub mod stream_layer;
pub mod weights;

pub use driver::{probe, GpuError};

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));

/// The committed PTX for a GPU of compute capability `cc`: compute_90 for 9.0 and newer (the
/// H100/H200: it adds dependent launch), compute_87 for 8.x (the Orin; the driver JIT-compiles
/// it for any 8.x), compute_72 for Volta/Xavier.
pub fn ptx_for(module: &str, cc: (i32, i32)) -> Option<&'static str> {
    let want = match cc.0 {
        9.. => 90,
        8 => 87,
        _ => 72,
    };
    PTX.iter()
        .find(|(m, arch, _)| *m == module && *arch == want)
        .map(|(_, _, text)| *text)
}
