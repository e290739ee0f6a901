//! The KV cache (BitLLM 4.1-4.2): a chain of append-only segments in the KV arena. Each segment
//! records its layout; a cost model, `alpha1 * bytes moved / bandwidth + alpha2 * unpack ops`,
//! picks the layout for new tokens, and a new segment starts only when another layout wins by a
//! margin for `persist` tokens in a row (phase-aware transitions). Old segments are never re-laid.
//!
//! Precisions: `F32` (the `native` and `f16` engines: one segment, `[layer][kv_head][position]
//! [head_dim]`, each KV head's rows one stream) and `I8` (w8a8, w4a8): int8 values with one f32
//! scale per (token, kv head, group of 32 along the head), `d = amax / 127`, round to nearest.
//!
//! Layouts of an int8 segment (the head axis `D` is contiguous in both; they differ in where a
//! head's tokens lie). Storage is counted in token slots of `kv_dim` bytes (+ scales) per layer:
//! - `TokenMajor`: slot per token, `[slot][kv_head][d]`, scales `[slot][kv_head][group]`. A head
//!   reads `head_dim` bytes every `kv_dim` and its scales at a stride of `kv_heads * groups * 4`.
//! - `HeadTiles`: tiles of `TILE` tokens, `[tile][kv_head][token][d]` (scales alike): one head's
//!   tokens of a tile are one contiguous run. The tile's slots are reserved whole.
//!
//! Attention runs the same per-token code over every segment (QK: exact int32 dot per group of
//! the int8 query and key, scaled once per group; SV: f32 weights times int8 values), so a mixed
//! chain gives bit-identical results to a single-layout cache.
//!
//! In files by meaning: `layout` (layouts, segments, the shape and the offsets they give),
//! `cost` (the cost model and the layout policy), `cache` ([`KvCache`]: storage, the chain,
//! key scales) and `attend` (its attention and kernels).

mod attend;
mod cache;
mod cost;
mod error;
mod layout;

pub use attend::heads_per_task;
pub use cache::{cpu_has_avx2, key_scales_from_bias, KvCache, Storage};
pub use cost::{policy_from, CostModel, Policy};
pub use error::KvError;
pub use layout::{quantize_head, Layout, Segment, Shape};

use serde::{Deserialize, Serialize};

/// Most segments a chain holds (the paper sees at most 5 in 10K-token runs).
pub const MAX_SEGMENTS: usize = 8;
/// Tokens per tile of a `HeadTiles` segment.
pub const TILE: usize = 64;
/// Widest head the int8 cache handles on the CPU.
pub const MAX_HEAD_DIM: usize = 256;

/// Whether a KV cache is int8 (the one rule, for both backends): at the int8 precisions
/// (w8a8, w4a8) unless `f32_kv`, where a head is whole groups of 32 and at most
/// `max_head_dim` wide (what the backend's attention takes: [`MAX_HEAD_DIM`] on the CPU,
/// `engine::cuda::INT8_KV_MAX_HEAD_DIM` on the GPU). Otherwise the cache stays f32.
pub fn int8_kv(
    precision: crate::quant::Precision,
    f32_kv: bool,
    head_dim: usize,
    max_head_dim: usize,
) -> bool {
    precision.int8_kv()
        && !f32_kv
        && head_dim.is_multiple_of(GROUP)
        && head_dim <= max_head_dim.min(MAX_HEAD_DIM)
}
const GROUP: usize = 32;

/// The table kind and format version of a calibrated cost model (`leanstream calibrate-kv`).
pub const TABLE_KIND: &str = "kvcost";
pub const TABLE_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvPrecision {
    F32,
    I8,
}

#[cfg(test)]
mod tests;
