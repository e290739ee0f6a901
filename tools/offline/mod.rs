//! Offline tools: what `leanstream` runs on a workstation to make the tables and reports the
//! daemon loads or the team reads, never on the serving path (`leanstreamd` uses none of it).
//!
//! - [`calibrate`]: activation thresholds and dropped-neuron means for target sparsities.
//! - [`cache_sim`]: the weight cache's miss ratios on a trace's activations, Belady beside.
//! - [`trace`]: the activation trace file (safetensors) and its reader.
//! - [`trace_stats`]: a trace's statistics for the sparsity report.
//! - [`coact`]: co-activation placement: neuron embeddings learned from traces, clustered into
//!   flash blocks (LeanStream 3.2.2).
//! - [`controller`]: the streaming controller's profile and its finite-horizon solver into
//!   the LUT (`leanstream controller`, LeanStream 3.2.3).
//! - [`calibrate_kv`]: the KV layout cost model's alphas fitted on this machine
//!   (`leanstream calibrate-kv`).
//! - [`flash`]: the flash image (`leanstream flash`), and [`placement`]: which neurons share
//!   a block, and what a placement costs over a trace's active sets.
//! - [`requant`]: a GGUF requantized into a precision's GGML types (`leanstream requant`).
//! - [`oracle`]: the oracle's neuron set (the calibrated thresholds' definition) all of these
//!   count by.
//! - [`train`]: the stacked learnable hashing predictor trained on a trace
//!   (`leanstream train-predictor`), and [`predictor_report`]: predictors measured on held-out
//!   text against the oracle (`leanstream predictor-report`), and [`refine_report`]:
//!   speculate-and-refine, layer n+1 guessed after each stage of layer n (`--refine`).

pub mod cache_sim;
pub mod calibrate;
pub mod calibrate_kv;
pub mod coact;
pub mod controller;
pub mod flash;
pub mod oracle;
pub mod placement;
pub mod predictor_report;
pub mod refine_report;
pub mod requant;
pub mod trace;
pub mod trace_stats;
pub mod train;
pub mod train_evict;
pub mod train_mlp;
