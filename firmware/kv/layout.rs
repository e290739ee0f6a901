//! Where a token's K and V lie: the layouts of a segment, the segment chain's links, the cache's
//! dimensions and the offsets they give, and the int8 quantization of one head.

use super::{GROUP, MAX_SEGMENTS, TILE};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    TokenMajor,
    HeadTiles,
}

impl Layout {
    pub const ALL: [Layout; 2] = [Layout::TokenMajor, Layout::HeadTiles];

    pub fn name(self) -> &'static str {
        match self {
            Layout::TokenMajor => "token-major",
            Layout::HeadTiles => "head-tiles",
        }
    }

    /// Token slots a segment of `len` tokens takes.
    pub(super) fn span(self, len: usize) -> usize {
        match self {
            Layout::TokenMajor => len,
            Layout::HeadTiles => len.next_multiple_of(TILE),
        }
    }
}

/// One append-only run of tokens in one layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First position it holds.
    pub start: usize,
    /// Positions it holds.
    pub len: usize,
    pub layout: Layout,
    /// First token slot (per layer) of its storage.
    pub(super) slot0: usize,
}

/// The cache's dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub n_layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Positions the cache holds.
    pub context: usize,
}

impl Shape {
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    pub(super) fn groups(&self) -> usize {
        self.head_dim / GROUP
    }
    /// Token slots per layer of an int8 cache: the context, plus room for every segment's
    /// last tile to be partly empty.
    pub fn slots(&self) -> usize {
        self.context + MAX_SEGMENTS * TILE
    }
    /// Values (bytes) of int8 data per K or V, all layers.
    pub fn i8_values(&self) -> usize {
        self.n_layers * self.slots() * self.kv_dim()
    }
    /// f32 scales per K or V, all layers.
    pub fn i8_scales(&self) -> usize {
        self.n_layers * self.slots() * self.kv_heads * self.groups()
    }
}

/// Offsets of (int8 data, scales) of token `i` of `seg`, head `h`, layer `l`.
#[inline(always)]
pub(super) fn addr(s: &Shape, seg: &Segment, l: usize, h: usize, i: usize) -> (usize, usize) {
    let (hd, g, kvh) = (s.head_dim, s.groups(), s.kv_heads);
    let layer = l * s.slots();
    match seg.layout {
        Layout::TokenMajor => {
            let slot = layer + seg.slot0 + i;
            (slot * kvh * hd + h * hd, slot * kvh * g + h * g)
        }
        Layout::HeadTiles => {
            let base = layer + seg.slot0 + (i / TILE) * TILE;
            let ti = i % TILE;
            (
                base * kvh * hd + (h * TILE + ti) * hd,
                base * kvh * g + (h * TILE + ti) * g,
            )
        }
    }
}

/// int8 quantization of one head, per group of 32: `d = amax / 127`, `q = round(x / d)`.
#[inline(always)]
pub fn quantize_head(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), db) in x
        .chunks_exact(GROUP)
        .zip(q.chunks_exact_mut(GROUP))
        .zip(d.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        for (qi, &v) in qb.iter_mut().zip(xb) {
            *qi = crate::model::ggml::round_half_away(v * id) as i8;
        }
        *db = dd;
    }
}
