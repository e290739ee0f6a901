//! CPU backend: a fixed worker pool, matrix-vector products over GGML-typed weights, and the
//! sparse down projection over neuron bundles.

pub mod axpy;
pub mod matvec;
pub mod pool;

pub use matvec::{matvec, matvec_many, ActScratch, Kernel, Matrix, Rows};
pub use pool::WorkerPool;
