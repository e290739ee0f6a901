//! Compute backends: `cpu` (worker pool, integer-dot matrix-vector products) and `cuda`
//! (kernels from the committed PTX, loaded at run time).
pub mod cpu;
pub mod cuda;
