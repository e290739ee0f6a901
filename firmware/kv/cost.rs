//! Which layout new tokens get: the cost model (LEP), the policy built on it, and the policy a
//! user asked for.

use super::layout::{Layout, Shape};
use super::{KvError, TABLE_KIND, TABLE_VERSION, TILE};
use serde::{Deserialize, Serialize};

/// The layout cost model, LEP in the paper: `alpha1 * bytes / bandwidth + alpha2 * ops`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Weight of the data-access term.
    pub alpha1: f64,
    /// Seconds per unpack/address operation.
    pub alpha2: f64,
    /// Bytes per second the board streams.
    pub bandwidth: f64,
    /// A challenger must be this much cheaper (0.02 = 2%) ...
    pub margin: f64,
    /// ... for this many tokens in a row before a new segment starts.
    pub persist: u32,
}

impl Default for CostModel {
    /// Uncalibrated: every byte at 10 GB/s, 1 ns per operation, 2% margin held for 32 tokens.
    fn default() -> Self {
        CostModel {
            alpha1: 1.0,
            alpha2: 1e-9,
            bandwidth: 10e9,
            margin: 0.02,
            persist: 32,
        }
    }
}

const LINE: usize = 64;

/// Bytes moved reading `run` bytes every `stride` bytes, per occurrence (64-byte lines).
fn strided(run: usize, stride: usize) -> f64 {
    stride.min(run.next_multiple_of(LINE)) as f64
}

impl CostModel {
    /// Bytes one decode step moves reading K and V of one layer for `t` tokens in `layout`.
    pub fn bytes(layout: Layout, s: &Shape, t: usize) -> f64 {
        let (hd, gs) = (s.head_dim, s.groups() * 4);
        let per_head = match layout {
            Layout::TokenMajor => {
                t as f64 * (strided(hd, s.kv_dim()) + strided(gs, s.kv_heads * gs))
            }
            Layout::HeadTiles => {
                let (full, rem) = (t / TILE, t % TILE);
                let tile = (TILE * hd).next_multiple_of(LINE) + (TILE * gs).next_multiple_of(LINE);
                let part = if rem > 0 {
                    (rem * hd).next_multiple_of(LINE) + (rem * gs).next_multiple_of(LINE)
                } else {
                    0
                };
                (full * tile + part) as f64
            }
        };
        2.0 * s.kv_heads as f64 * per_head
    }

    /// Unpack and address operations of one decode step over one layer (static count of the
    /// kernels below: per token and head, one int8->f32 conversion per V value, one
    /// multiply-add per K value pair, one address computation; per tile, a pointer reset).
    pub fn unpack_ops(layout: Layout, s: &Shape, t: usize) -> f64 {
        let per_token = (s.head_dim + s.head_dim / 2 + 2 + 4) as f64;
        let extra = match layout {
            Layout::TokenMajor => 2.0 * t as f64,
            Layout::HeadTiles => 16.0 * t.div_ceil(TILE) as f64,
        };
        s.kv_heads as f64 * (per_token * t as f64 + extra)
    }

    pub fn cost(&self, layout: Layout, s: &Shape, t: usize) -> f64 {
        self.alpha1 * Self::bytes(layout, s, t) / self.bandwidth
            + self.alpha2 * Self::unpack_ops(layout, s, t)
    }

    /// The cheapest layout at `t` tokens.
    pub fn best(&self, s: &Shape, t: usize) -> Layout {
        let mut best = Layout::TokenMajor;
        for l in Layout::ALL {
            if self.cost(l, s, t) < self.cost(best, s, t) {
                best = l;
            }
        }
        best
    }

    /// A clear error for values no calibration gives.
    pub fn check(&self) -> Result<(), KvError> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        let bw_ok = self.bandwidth.is_finite() && self.bandwidth > 0.0;
        if !(ok(self.alpha1) && ok(self.alpha2) && ok(self.margin) && bw_ok) {
            return Err(KvError::InvalidConstants {
                path: None,
                constants: *self,
            });
        }
        Ok(())
    }
}

/// How the layout of new tokens is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// The cost model decides (the default).
    Adaptive(CostModel),
    /// One layout for every token (the "no adaptive KV" ablation).
    Fixed(Layout),
}

/// The layout policy a user asked for: `adaptive` (the cost model, from a `kvcost` table made
/// by `leanstream calibrate-kv` for this model, else the built-in constants), `token-major` or
/// `head-tiles` (one layout throughout). A table for another model, of another version, or
/// damaged, is a clear error.
pub fn policy_from(
    model: &crate::model::ModelFile,
    table: Option<&std::path::Path>,
    layout: &str,
) -> Result<Policy, KvError> {
    let fixed = match layout {
        "adaptive" => None,
        "token-major" => Some(Layout::TokenMajor),
        "head-tiles" => Some(Layout::HeadTiles),
        _ => return Err(KvError::UnknownLayout(layout.into())),
    };
    let model_cost = match table {
        None => CostModel::default(),
        Some(p) => {
            let id = crate::tables::model_identity(model);
            let m: CostModel =
                crate::tables::read(p, TABLE_KIND, TABLE_VERSION, id).map_err(|source| {
                    KvError::Table {
                        path: p.to_path_buf(),
                        source,
                    }
                })?;
            if m.check().is_err() {
                return Err(KvError::InvalidConstants {
                    path: Some(p.to_path_buf()),
                    constants: m,
                });
            }
            m
        }
    };
    Ok(match fixed {
        Some(l) => Policy::Fixed(l),
        None => Policy::Adaptive(model_cost),
    })
}
