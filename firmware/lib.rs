//! LeanStream: a fixed-memory LLM inference engine for NVIDIA Jetson boards.
//!
//! One subsystem per folder, in layers (docs/ARCHITECTURE.md; `tests/layers.rs` checks that
//! each imports only from its own layer or below, without cycles):
//!
//! 1. `board` (the board's build-time consts, from `board-configs/*.toml` by `build.rs`),
//!    `sys` (OS glue: systemd notify, signals, the Unix socket, logging).
//! 2. `boot`: the arenas allocated once at boot, and the check that a model fits them.
//! 3. `model` (GGUF, llama2.c, GGML types), `tables` (versioned, checksummed postcard files),
//!    `tokenizer` (BPE, SentencePiece, llama2.c vocabularies, chat templates), `load`.
//! 4. `ops`: rmsnorm, softmax, silu, rope, one copy each.
//! 5. `quant` (low-bit weight formats, weight views), `kv` (the KV cache's append-only
//!    segments and layout cost model), `sparsity` (neuron bundles, tiles, modes, thresholds),
//!    `predict` (which FFN blocks a token will need: the `Predictor` interface),
//!    `stream` (the SSD I/O lanes and the weight cache).
//! 6. `backend`: kernels: `cpu` (kernel choice, matrix-vector products, integer low-bit
//!    kernels, the sparse FFN, worker pool) and `cuda` (driver, weight images, PTX, flags).
//! 7. `engine`: the `Decoder` trait, the CPU and CUDA decoders, generation, sampling,
//!    perplexity.
//! 8. `serve`: the daemon: OpenAI-compatible HTTP/1.1, client slots, queue, engine thread.
//!
//! The tools above them (`leanstream bench`, calibration, traces, requantization, plots, the
//! client for the daemon's socket, and the `leanstream` CLI) are another crate, `tools/`
//! (`leanstream-tools`): `leanstreamd` links none of them.

pub mod backend;
pub mod board;
pub mod boot;
pub mod control;
pub mod engine;
pub mod kv;
pub mod load;
pub mod model;
pub mod ops;
pub mod predict;
pub mod quant;
pub mod serve;
pub mod sparsity;
pub mod stream;
pub mod sys;
pub mod tables;
pub mod tokenizer;
