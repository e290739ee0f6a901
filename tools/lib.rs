//! LeanStream's tools: what runs on a workstation or in a terminal, never in the daemon.
//! `leanstreamd` (the `leanstream` crate at the repository root) links none of it.
//!
//! - [`bench`]: `leanstream bench`: decode and prefill timings, the JSON report and its plots.
//! - [`offline`]: calibration of thresholds and the KV cost model, activation traces,
//!   requantization.
//! - [`client`]: the CLI's client for the daemon's Unix socket (HTTP/1.1 and SSE).
//!
//! The `leanstream` CLI (bin/) is built on these and on the `leanstream` library.

pub mod bench;
pub mod client;
pub mod offline;
