//! CPU backend: a fixed worker pool and matrix-vector products over GGML-typed weights.

pub mod matvec;
pub mod pool;

pub use matvec::{matvec, matvec_many, ActScratch, Kernel, Matrix};
pub use pool::WorkerPool;
