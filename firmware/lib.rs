//! LeanStream: a fixed-memory LLM inference engine for NVIDIA Jetson boards.
//!
//! One subsystem per folder:
//! - `board`: the board's build-time consts (from `board-configs/*.toml`, made by `build.rs`).
//! - `boot`: the arenas allocated once at boot, and the check that a model fits them.
//! - `model`: file formats (GGUF, llama2.c checkpoints) and GGML tensor types.
//! - `tokenizer`: byte-level BPE, SentencePiece-style BPE, llama2.c vocabularies, chat templates.
//! - `backend`: compute kernels: `cpu` (matrix-vector products, worker pool) and `cuda`
//!   (kernels from the committed PTX in kernels-ptx/, CUDA graphs, mapped-memory flags).
//! - `bench`: `leanstream bench`, configurations side by side, JSON / Markdown / PNG.
//! - `engine`: the forward pass, KV cache and sampling.
//! - `serve`: the daemon: OpenAI-compatible HTTP/1.1 protocol layer, client slots, request
//!   queue and engine thread (`serve/server.rs`), metrics.
//! - `sys`: OS glue for the daemon (systemd notify, signals, the Unix socket, logging).
//! - `client`: the CLI's HTTP/1.1 client for the daemon's Unix socket.
//! - `quant`: low-bit weight formats (w8, w4 and its packings), requantization, integer kernels.
//! - `kv`: the KV cache as a chain of append-only segments, each with its own layout, and the
//!   cost model that picks the layout of new tokens.
//! - `sparsity`: neuron bundles and the sparse FFN, calibrated thresholds, activation traces.
//! - `tables`: versioned, checksummed postcard files made offline (thresholds, cost models).

pub mod backend;
pub mod bench;
pub mod board;
pub mod boot;
pub mod client;
pub mod engine;
pub mod kv;
pub mod load;
pub mod model;
pub mod quant;
pub mod serve;
pub mod sparsity;
pub mod sys;
pub mod tables;
pub mod tokenizer;
