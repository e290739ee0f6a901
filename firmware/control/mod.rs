//! The streaming controller (LeanStream paper 3.2.3, eq. 3-9; DESIGN.md section 6 item 5 and
//! section 7 (e)): per layer, the state is the layer's remaining load volume (bytes still to
//! read when the layer starts) quantized into a few bins, and the action is a [`StreamPlan`]:
//! caps on the knobs the daemon owns (I/O lanes and queue depth in use, the compute share,
//! the prefetch depth, and on a board that says `dvfs` a frequency cap). The finite-horizon
//! problem (eq. 7) is solved offline (`leanstream controller solve`) into a [`Lut`]; online a
//! plan is one lookup that allocates nothing (eq. 9).
//!
//! Layer 5: imports only the board (1) and the tables' file format (3). The engine (7) applies
//! a plan to the CPU streamed FFN; the GPU path reads the same value (its compute share is a
//! share of the multiprocessors instead of the worker pool).

mod clocks;
mod lut;
#[cfg(test)]
use lut::LutFile;
mod plan;

pub use clocks::Clocks;
pub use lut::{Lut, LutError, LUT_KIND, LUT_VERSION, MAX_STATES};
pub use plan::{FreqCap, PlanCaps, PlanError, StreamPlan};

/// What one layer-step of the streamed FFN did under a plan: what the offline profiler
/// records (`StreamedFfn::set_profiling`) for T^I, T^II, the energy proxy and the next state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerSample {
    pub layer: u16,
    /// Remaining load volume when the layer started: bytes of its wanted blocks not yet in
    /// the cache (the state before quantization, R_n).
    pub remaining_bytes: u64,
    /// The plan applied, as an index of the caller's plan table.
    pub plan: u16,
    /// Interval I: time the layer waited for its reads.
    pub io_ns: u64,
    /// Interval II: the rest of the layer's streamed FFN (computing the runs, bookkeeping).
    pub compute_ns: u64,
    /// Bytes the lanes read from the disk during the layer (its own and read-ahead).
    pub bytes_read: u64,
    /// Workers the layer's runs were allowed (the compute share applied to the pool).
    pub workers: u16,
}

#[cfg(test)]
mod tests;
