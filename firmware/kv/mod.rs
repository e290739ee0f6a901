//! The KV cache (BitLLM 4.1-4.2): a chain of append-only segments in the KV arena. Each segment
//! records its layout; a cost model, `alpha1 * bytes moved / bandwidth + alpha2 * unpack ops`,
//! picks the layout for new tokens, and a new segment starts only when another layout wins by a
//! margin for `persist` tokens in a row (phase-aware transitions). Old segments are never re-laid.
//!
//! Precisions: `F16` (the `native` and `f16` engines; IEEE half, rounded to nearest even) and
//! `F32` (asked for: the reference), one segment each, `[layer][kv_head][position][head_dim]`,
//! each KV head's rows one stream; and `I8` (w8a8, w4a8): int8 values with one f32 scale per
//! (token, kv head, group of 32 along the head), `d = amax / 127`, round to nearest.
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

/// What a KV cache is asked to hold (`EngineOptions::kv`, `CudaOptions::kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvChoice {
    /// int8 at the int8 precisions (w8a8, w4a8) where the head allows, else f16.
    #[default]
    Auto,
    /// f16 at every precision (a reference for a backend whose int8 cache cannot take a head).
    F16,
    /// f32 at every precision: the reference the others are measured against.
    F32,
}

/// A KV cache's precision (the one rule, for both backends). int8 at the int8 precisions
/// (w8a8, w4a8) when `Auto`, where a head is whole groups of 32 and at most `max_head_dim`
/// wide (what the backend's attention takes: [`MAX_HEAD_DIM`] on the CPU,
/// `engine::cuda::INT8_KV_MAX_HEAD_DIM` on the GPU). Otherwise f16 (llama.cpp's default too):
/// half the bytes of f32, which is what decode at a long context reads, and half the KV
/// arena; f32 only when asked.
pub fn kv_precision(
    precision: crate::quant::Precision,
    choice: KvChoice,
    head_dim: usize,
    max_head_dim: usize,
) -> KvPrecision {
    match choice {
        KvChoice::F32 => KvPrecision::F32,
        KvChoice::F16 => KvPrecision::F16,
        KvChoice::Auto
            if precision.int8_kv()
                && head_dim.is_multiple_of(GROUP)
                && head_dim <= max_head_dim.min(MAX_HEAD_DIM) =>
        {
            KvPrecision::I8
        }
        KvChoice::Auto => KvPrecision::F16,
    }
}
const GROUP: usize = 32;

/// The table kind and format version of a calibrated cost model (`leanstream calibrate-kv`).
pub const TABLE_KIND: &str = "kvcost";
pub const TABLE_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvPrecision {
    F32,
    F16,
    I8,
}

impl KvPrecision {
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::I8 => "int8",
        }
    }

    /// Bytes of one stored value (an int8 cache's scales are apart).
    pub fn value_bytes(self) -> usize {
        match self {
            KvPrecision::F32 => 4,
            KvPrecision::F16 => 2,
            KvPrecision::I8 => 1,
        }
    }

    /// The kernels' code for it (common.cuh's KV_F32, KV_I8, KV_F16).
    pub fn kernel_code(self) -> i32 {
        match self {
            KvPrecision::F32 => 0,
            KvPrecision::I8 => 1,
            KvPrecision::F16 => 2,
        }
    }

    /// The choice that gives this precision wherever the head allows it (a reference
    /// configuration's cache as another backend keeps it).
    pub fn choice(self) -> KvChoice {
        match self {
            KvPrecision::F32 => KvChoice::F32,
            KvPrecision::F16 => KvChoice::F16,
            KvPrecision::I8 => KvChoice::Auto,
        }
    }
}

#[cfg(test)]
mod tests;
