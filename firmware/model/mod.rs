//! Model file formats: GGUF (v2/v3) and llama2.c checkpoints, and the GGML tensor types.

pub mod ggml;
pub mod gguf;

pub use gguf::FormatError;
