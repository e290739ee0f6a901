//! A streaming plan: caps under the board's fixed maxima. Nothing is re-allocated to apply one:
//! the lanes' staging buffers, the queue and the pool are sized once at boot by the board, and a
//! plan only says how much of them a layer may use.

use crate::board;
use std::fmt;

/// A frequency cap for the GPU and the memory controller (Jetson sysfs `devfreq`), in MHz.
/// Only on a board whose config says `dvfs = true`; never on the GPU test machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FreqCap {
    pub gpu_mhz: u32,
    pub emc_mhz: u32,
}

/// The knobs of one layer's streamed FFN (paper: the coordination plan phi_n).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamPlan {
    /// I/O lanes that take reads (1..=the board's `io.lanes`).
    pub lanes: u16,
    /// Reads in flight per lane (1..=the board's `io.queue_depth`).
    pub queue_depth: u16,
    /// Share of the compute units the layer's runs use, in percent (1..=100): of the worker
    /// pool on the CPU, of the multiprocessors of the persistent kernel on the GPU.
    pub compute_percent: u8,
    /// Prefetch depth: stages after which the next layer's reads are re-ranked and queued
    /// ahead (speculate-and-refine; 0 reads nothing ahead). Applies where the predictor can
    /// guess the next layer during this one (a table reading prev-ffn-output).
    pub prefetch: u8,
    /// A frequency cap; `None` unless the board says `dvfs`.
    pub freq: Option<FreqCap>,
}

/// The fixed maxima a plan caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanCaps {
    pub lanes: u16,
    pub queue_depth: u16,
    pub dvfs: bool,
}

/// Why a plan does not fit the board.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    Lanes {
        got: u16,
        max: u16,
    },
    QueueDepth {
        got: u16,
        max: u16,
    },
    ComputePercent(u8),
    /// A frequency cap on a board without `dvfs`.
    NoDvfs,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Lanes { got, max } => {
                write!(f, "plan uses {got} I/O lanes, the board has 1 to {max}")
            }
            PlanError::QueueDepth { got, max } => {
                write!(
                    f,
                    "plan uses queue depth {got}, the board allows 1 to {max}"
                )
            }
            PlanError::ComputePercent(p) => {
                write!(f, "plan's compute share is {p}%, it must be 1 to 100")
            }
            PlanError::NoDvfs => write!(
                f,
                "plan sets a frequency cap, but this board's config does not say dvfs = true"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

impl PlanCaps {
    /// This build's board.
    pub fn board() -> PlanCaps {
        PlanCaps {
            lanes: board::IO_LANES.min(u16::MAX as usize) as u16,
            queue_depth: board::IO_QUEUE_DEPTH.min(u16::MAX as usize) as u16,
            dvfs: board::DVFS,
        }
    }
}

impl StreamPlan {
    /// The board's defaults: every lane at full depth, the whole pool, prefetch after the
    /// layer (1), clocks as they are (the "Fix" row of the paper's Table 5).
    pub fn board_default() -> StreamPlan {
        let caps = PlanCaps::board();
        StreamPlan {
            lanes: caps.lanes,
            queue_depth: caps.queue_depth,
            compute_percent: 100,
            prefetch: 1,
            freq: None,
        }
    }

    pub fn check(&self, caps: PlanCaps) -> Result<(), PlanError> {
        if self.lanes == 0 || self.lanes > caps.lanes {
            return Err(PlanError::Lanes {
                got: self.lanes,
                max: caps.lanes,
            });
        }
        if self.queue_depth == 0 || self.queue_depth > caps.queue_depth {
            return Err(PlanError::QueueDepth {
                got: self.queue_depth,
                max: caps.queue_depth,
            });
        }
        if self.compute_percent == 0 || self.compute_percent > 100 {
            return Err(PlanError::ComputePercent(self.compute_percent));
        }
        if self.freq.is_some() && !caps.dvfs {
            return Err(PlanError::NoDvfs);
        }
        Ok(())
    }

    /// Compute units out of `units` (pool threads or multiprocessors) the plan lets a layer
    /// use: the share rounded up, at least one.
    pub fn compute_units(&self, units: usize) -> usize {
        (units * self.compute_percent as usize)
            .div_ceil(100)
            .clamp(1, units.max(1))
    }

    /// A short label: `l4 q64 c100% p1` (and ` f<gpu>/<emc>` with a frequency cap).
    pub fn label(&self) -> String {
        let mut s = format!(
            "l{} q{} c{}% p{}",
            self.lanes, self.queue_depth, self.compute_percent, self.prefetch
        );
        if let Some(f) = self.freq {
            s.push_str(&format!(" f{}/{}", f.gpu_mhz, f.emc_mhz));
        }
        s
    }
}

impl std::str::FromStr for StreamPlan {
    type Err = String;

    /// `lanes:depth:compute%:prefetch`, e.g. `2:16:50:1` (no frequency cap).
    fn from_str(s: &str) -> Result<StreamPlan, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad =
            || format!("'{s}' is not a plan: write LANES:DEPTH:COMPUTE%:PREFETCH, e.g. 2:16:50:1");
        if parts.len() != 4 {
            return Err(bad());
        }
        let num = |i: usize| {
            parts[i]
                .trim_end_matches('%')
                .parse::<u16>()
                .map_err(|_| bad())
        };
        let (lanes, queue_depth, compute, prefetch) = (num(0)?, num(1)?, num(2)?, num(3)?);
        if compute > 100 || prefetch > u8::MAX as u16 {
            return Err(bad());
        }
        Ok(StreamPlan {
            lanes,
            queue_depth,
            compute_percent: compute as u8,
            prefetch: prefetch as u8,
            freq: None,
        })
    }
}
