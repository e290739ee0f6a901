//! Compute backends: `cpu` (worker pool, integer-dot matrix-vector products) and `cuda`
//! (kernels from the committed PTX, loaded at run time; behind the `cuda` feature, on by
//! default, so a CPU-only build links no CUDA bindings).
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
