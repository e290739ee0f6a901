//! The KV cache (BitLLM 4.1-4.2): a chain of append-only segments in the KV arena. Each segment
//! records its layout; a cost model, `alpha1 * bytes moved / bandwidth + alpha2 * unpack ops`,
//! picks the layout for new tokens, and a new segment starts only when another layout wins by a
//! margin for `persist` tokens in a row (phase-aware transitions). Old segments are never re-laid.
//!
//! Precisions: `F32` (the `native` and `f16` engines: one token-major segment, exactly the
//! classic `[layer][position][kv_dim]` cache) and `I8` (w8a8, w4a8): int8 values with one f32
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

mod error;

pub use error::KvError;

use crate::ops::softmax;
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
    fn span(self, len: usize) -> usize {
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
    slot0: usize,
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
    fn groups(&self) -> usize {
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

/// The storage of a cache, carved from the KV arena at boot (or any buffers, for tests and the
/// calibration benchmark).
pub enum Storage<'a> {
    /// `[layer][position][kv_dim]` keys and values.
    F32 { k: &'a mut [f32], v: &'a mut [f32] },
    /// int8 values (`Shape::i8_values`), scales (`Shape::i8_scales`), and the f32 rows the
    /// forward pass writes a token's K and V into before they are quantized (`kv_dim` each).
    I8 {
        k: &'a mut [i8],
        v: &'a mut [i8],
        ks: &'a mut [f32],
        vs: &'a mut [f32],
        kbuf: &'a mut [f32],
        vbuf: &'a mut [f32],
    },
}

/// The KV cache: storage plus the segment chain (fixed capacity, no heap).
pub struct KvCache<'a> {
    pub shape: Shape,
    store: Storage<'a>,
    segs: heapless::Vec<Segment, MAX_SEGMENTS>,
    policy: Policy,
    /// Tokens in a row the best other layout has won by the margin.
    streak: u32,
    /// Per layer and K channel (n_layers x kv_dim): the int8 cache stores K divided by it and
    /// multiplies queries by it, so q.k is unchanged while outlier channels stop swamping their
    /// group's scale (see [`key_scales_from_bias`]).
    key_scale: Option<&'a [f32]>,
    /// Whether `attend` runs its AVX2 build: the engine's kernel choice, made once at boot and
    /// set with [`KvCache::set_avx2`], which keeps it false where the CPU lacks the features.
    avx2: bool,
}

/// True where this CPU has what `attend_avx2` is compiled for (AVX2, FMA, F16C).
pub fn cpu_has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl<'a> KvCache<'a> {
    /// Panics when the storage does not match the shape (boot sizes it from the same shape).
    pub fn new(shape: Shape, store: Storage<'a>, policy: Policy) -> KvCache<'a> {
        match &store {
            Storage::F32 { k, v } => {
                let n = shape.n_layers * shape.context * shape.kv_dim();
                assert!(k.len() >= n && v.len() >= n, "f32 KV storage too small");
            }
            Storage::I8 {
                k,
                v,
                ks,
                vs,
                kbuf,
                vbuf,
            } => {
                assert!(shape.head_dim.is_multiple_of(GROUP) && shape.head_dim <= MAX_HEAD_DIM);
                assert!(k.len() >= shape.i8_values() && v.len() >= shape.i8_values());
                assert!(ks.len() >= shape.i8_scales() && vs.len() >= shape.i8_scales());
                assert!(kbuf.len() == shape.kv_dim() && vbuf.len() == shape.kv_dim());
            }
        }
        KvCache {
            shape,
            store,
            segs: heapless::Vec::new(),
            policy,
            streak: 0,
            key_scale: None,
            avx2: false,
        }
    }

    /// Lets `attend` run its AVX2 build (bit-identical to the portable one, faster) when `want`
    /// and the CPU has the features; the engine passes its kernel choice.
    pub fn set_avx2(&mut self, want: bool) {
        self.avx2 = want && cpu_has_avx2();
    }

    pub fn precision(&self) -> KvPrecision {
        match self.store {
            Storage::F32 { .. } => KvPrecision::F32,
            Storage::I8 { .. } => KvPrecision::I8,
        }
    }

    /// The segment chain.
    pub fn segments(&self) -> &[Segment] {
        &self.segs
    }

    /// Makes room for position `pos`: forgets positions `pos..` (writing position p overwrites
    /// the cache from p on), then appends `pos` to the last segment, or to a new one when the
    /// policy says another layout has won.
    pub fn begin_token(&mut self, pos: usize) {
        assert!(pos < self.shape.context, "position {pos} past the KV cache");
        while let Some(last) = self.segs.last_mut() {
            if last.start >= pos {
                self.segs.pop();
                self.streak = 0;
                continue;
            }
            if last.start + last.len > pos {
                last.len = pos - last.start;
                self.streak = 0;
            }
            break;
        }
        // Positions skipped over (never in order use) hold whatever the slots held.
        match self.segs.last_mut() {
            Some(last) if last.start + last.len < pos => last.len = pos - last.start,
            _ => {}
        }
        let want = match (self.policy, self.precision()) {
            (_, KvPrecision::F32) => Layout::TokenMajor,
            (Policy::Fixed(l), _) => l,
            (Policy::Adaptive(m), _) => {
                let t = pos + 1;
                let best = m.best(&self.shape, t);
                match self.segs.last() {
                    None => best,
                    Some(cur) if best == cur.layout => {
                        self.streak = 0;
                        cur.layout
                    }
                    Some(cur) => {
                        let wins = m.cost(best, &self.shape, t)
                            < (1.0 - m.margin) * m.cost(cur.layout, &self.shape, t);
                        self.streak = if wins { self.streak + 1 } else { 0 };
                        if self.streak >= m.persist.max(1) && !self.segs.is_full() {
                            self.streak = 0;
                            best
                        } else {
                            cur.layout
                        }
                    }
                }
            }
        };
        match self.segs.last_mut() {
            Some(last) if last.layout == want => last.len += 1,
            None => {
                let seg = Segment {
                    start: 0,
                    len: pos + 1,
                    layout: want,
                    slot0: 0,
                };
                self.segs.push(seg).expect("segment chain has room");
            }
            Some(_) => {
                let slot0 = self
                    .segs
                    .last()
                    .map_or(0, |s| s.slot0 + s.layout.span(s.len));
                let seg = Segment {
                    start: pos,
                    len: 1,
                    layout: want,
                    slot0,
                };
                // A full chain was kept above (only `want == last.layout` then).
                self.segs.push(seg).expect("segment chain has room");
            }
        }
    }

    /// The rows the forward pass writes position `pos`'s key and value of layer `l` into.
    pub fn rows(&mut self, l: usize, pos: usize) -> (&mut [f32], &mut [f32]) {
        let kv_dim = self.shape.kv_dim();
        match &mut self.store {
            Storage::F32 { k, v } => {
                let at = (l * self.shape.context + pos) * kv_dim;
                (&mut k[at..at + kv_dim], &mut v[at..at + kv_dim])
            }
            Storage::I8 { kbuf, vbuf, .. } => (&mut kbuf[..], &mut vbuf[..]),
        }
    }

    /// Sets the key scales (n_layers x kv_dim values, all >= 1). Only the int8 cache uses them.
    pub fn scale_keys(&mut self, scales: &'a [f32]) {
        let s = self.shape;
        assert_eq!(scales.len(), s.n_layers * s.kv_dim(), "key scales");
        self.key_scale = Some(scales);
    }

    /// The largest key scale, when keys are scaled and any scale is above 1.
    pub fn largest_key_scale(&self) -> Option<f32> {
        let f = self.key_scale?.iter().copied().fold(1.0, f32::max);
        (f > 1.0).then_some(f)
    }

    /// Stores the rows written for position `pos` of layer `l` (int8: quantizes them into the
    /// segment holding `pos`; f32: they are already in place).
    pub fn commit(&mut self, l: usize, pos: usize) {
        let s = self.shape;
        let (hd, g) = (s.head_dim, s.groups());
        let Some((seg, i)) = self.find(pos) else {
            panic!("position {pos} was not begun");
        };
        let key_scale = self.key_scale;
        if let Storage::I8 {
            k,
            v,
            ks,
            vs,
            kbuf,
            vbuf,
        } = &mut self.store
        {
            let mut scaled = [0f32; MAX_HEAD_DIM];
            for h in 0..s.kv_heads {
                let (d, sc) = addr(&s, &seg, l, h, i);
                let key = match head_scales(key_scale, &s, l, h) {
                    Some(f) => {
                        for ((o, &x), &f) in scaled.iter_mut().zip(&kbuf[h * hd..][..hd]).zip(f) {
                            *o = x / f;
                        }
                        &scaled[..hd]
                    }
                    None => &kbuf[h * hd..][..hd],
                };
                quantize_head(key, &mut k[d..d + hd], &mut ks[sc..sc + g]);
                quantize_head(
                    &vbuf[h * hd..][..hd],
                    &mut v[d..d + hd],
                    &mut vs[sc..sc + g],
                );
            }
        }
    }

    /// The segment holding `pos` and its index there.
    fn find(&self, pos: usize) -> Option<(Segment, usize)> {
        self.segs
            .iter()
            .find(|s| pos >= s.start && pos < s.start + s.len)
            .map(|s| (*s, pos - s.start))
    }

    /// Scaled dot-product attention of one query head `q` over positions `0..=pos` of KV head
    /// `kv_head` in layer `l`: `att` gets the softmax weights (`pos + 1` of them), `out` the
    /// weighted values.
    pub fn attend(
        &self,
        l: usize,
        kv_head: usize,
        q: &[f32],
        pos: usize,
        att: &mut [f32],
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `set_avx2` sets the flag only where the CPU has AVX2, FMA and F16C.
            return unsafe { self.attend_avx2(l, kv_head, q, pos, att, out) };
        }
        self.attend_any(l, kv_head, q, pos, att, out)
    }

    /// The same code compiled for AVX2: 8-wide loops over the head and the int8 groups. Rust
    /// never fuses or reorders float operations, so the results equal the baseline build's
    /// bit for bit (tested).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn attend_avx2(
        &self,
        l: usize,
        kv_head: usize,
        q: &[f32],
        pos: usize,
        att: &mut [f32],
        out: &mut [f32],
    ) {
        self.attend_any(l, kv_head, q, pos, att, out)
    }

    #[inline(always)]
    fn attend_any(
        &self,
        l: usize,
        kv_head: usize,
        q: &[f32],
        pos: usize,
        att: &mut [f32],
        out: &mut [f32],
    ) {
        let s = &self.shape;
        match &self.store {
            Storage::F32 { k, v } => {
                let n = s.context * s.kv_dim();
                attend_f32(
                    q,
                    &k[l * n..(l + 1) * n],
                    &v[l * n..(l + 1) * n],
                    s.kv_dim(),
                    kv_head * s.head_dim,
                    &mut att[..pos + 1],
                    out,
                )
            }
            Storage::I8 { k, v, ks, vs, .. } => {
                self.attend_i8(k, v, ks, vs, l, kv_head, q, pos, att, out)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn attend_i8(
        &self,
        k: &[i8],
        v: &[i8],
        ks: &[f32],
        vs: &[f32],
        l: usize,
        kv_head: usize,
        q: &[f32],
        pos: usize,
        att: &mut [f32],
        out: &mut [f32],
    ) {
        let s = &self.shape;
        let (hd, ng) = (s.head_dim, s.groups());
        let mut qq = [0i8; MAX_HEAD_DIM];
        let mut dq = [0f32; MAX_HEAD_DIM / GROUP];
        // With key scales the query, times them, stays f32: its scaled outlier channels would
        // swamp its own int8 groups. Without, it is quantized and dotted in integers.
        let mut qs = [0f32; MAX_HEAD_DIM];
        let key_scale = head_scales(self.key_scale, s, l, kv_head).map(|f| {
            for ((o, &x), &f) in qs.iter_mut().zip(q).zip(f) {
                *o = x * f;
            }
            &qs[..hd]
        });
        if key_scale.is_none() {
            quantize_head(q, &mut qq[..hd], &mut dq[..ng]);
        }
        let scale = 1.0 / (hd as f32).sqrt();
        for seg in &self.segs {
            for i in 0..seg.len.min((pos + 1).saturating_sub(seg.start)) {
                let (d, sc) = addr(s, seg, l, kv_head, i);
                let mut acc = 0f32;
                for g in 0..ng {
                    let kg = &k[d + g * GROUP..][..GROUP];
                    acc += match key_scale {
                        Some(qf) => ks[sc + g] * fdot_i8(&qf[g * GROUP..][..GROUP], kg),
                        None => (dq[g] * ks[sc + g]) * idot32(&qq[g * GROUP..][..GROUP], kg) as f32,
                    };
                }
                att[seg.start + i] = acc * scale;
            }
        }
        let att = &mut att[..pos + 1];
        softmax(att);
        out.fill(0.0);
        for seg in &self.segs {
            for i in 0..seg.len.min((pos + 1).saturating_sub(seg.start)) {
                let (d, sc) = addr(s, seg, l, kv_head, i);
                let p = att[seg.start + i];
                for g in 0..ng {
                    let w = p * vs[sc + g];
                    axpy_i8(
                        &mut out[g * GROUP..][..GROUP],
                        w,
                        &v[d + g * GROUP..][..GROUP],
                    );
                }
            }
        }
    }
}

/// Key head `h` of layer `l`'s scales, when keys are scaled.
#[inline(always)]
fn head_scales<'b>(scales: Option<&'b [f32]>, s: &Shape, l: usize, h: usize) -> Option<&'b [f32]> {
    scales.map(|f| &f[l * s.kv_dim() + h * s.head_dim..][..s.head_dim])
}

/// Offsets of (int8 data, scales) of token `i` of `seg`, head `h`, layer `l`.
#[inline(always)]
fn addr(s: &Shape, seg: &Segment, l: usize, h: usize, i: usize) -> (usize, usize) {
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

/// How much larger than the head's median |bias| a K channel's bias may be before its pair of
/// channels is scaled down in the int8 cache.
const KEY_OUTLIER: f32 = 8.0;

/// Key scales from a model's K bias (qwen2: in the first layers a few channels carry biases of
/// 100-160 against a median of 1-6, and in int8 with one scale per 32 channels they leave the
/// rest of their group a step of ~1). Rope turns channel pairs (`pairs` gives pair `i`'s two
/// channels), so both channels of a pair get one scale: max(1, largest |bias| of the pair /
/// (KEY_OUTLIER x the head's median |bias|)). `bias` and `out` are kv_dim long.
pub fn key_scales_from_bias(
    bias: &[f32],
    head_dim: usize,
    pairs: impl Fn(usize) -> (usize, usize),
    out: &mut [f32],
) {
    assert!(head_dim <= MAX_HEAD_DIM && bias.len() == out.len());
    for (b, o) in bias
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
    {
        let mut mags = [0f32; MAX_HEAD_DIM];
        for (m, x) in mags.iter_mut().zip(b) {
            *m = x.abs();
        }
        let mags = &mut mags[..head_dim];
        mags.sort_unstable_by(f32::total_cmp);
        let limit = KEY_OUTLIER * mags[head_dim / 2].max(f32::MIN_POSITIVE);
        for i in 0..head_dim / 2 {
            let (a, c) = pairs(i);
            let f = (b[a].abs().max(b[c].abs()) / limit).max(1.0);
            (o[a], o[c]) = (f, f);
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

/// f32 dot of 32 floats with 32 int8 (eight partial sums, which vectorize).
#[inline(always)]
fn fdot_i8(a: &[f32], b: &[i8]) -> f32 {
    let mut acc = [0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += ca[j] * cb[j] as f32;
        }
    }
    acc.iter().sum()
}

/// Exact int32 dot of 32 int8 pairs.
#[inline(always)]
fn idot32(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = 0i32;
    for (x, y) in a.iter().zip(b) {
        acc += *x as i32 * *y as i32;
    }
    acc
}

/// `out += w * v` (v int8) over one group.
#[inline(always)]
fn axpy_i8(out: &mut [f32], w: f32, v: &[i8]) {
    // Over fixed-size arrays the compiler vectorizes it (over slices it left it scalar, most
    // of a prefill's int8 attention); the arithmetic per element is the same.
    let out: &mut [f32; GROUP] = out.try_into().expect("one group");
    let v: &[i8; GROUP] = v.try_into().expect("one group");
    let vf: [f32; GROUP] = v.map(|x| x as f32);
    for (o, x) in out.iter_mut().zip(vf) {
        *o += w * x;
    }
}

/// The f32 cache's attention (unchanged from the classic engine: golden results stay exact).
#[inline(always)]
fn attend_f32(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    kv_dim: usize,
    off: usize,
    att: &mut [f32],
    out: &mut [f32],
) {
    let head_dim = q.len();
    let scale = 1.0 / (head_dim as f32).sqrt();
    for (t, a) in att.iter_mut().enumerate() {
        let k = &keys[t * kv_dim + off..][..head_dim];
        *a = dot(q, k) * scale;
    }
    softmax(att);
    // The weighted values, 32 outputs at a time in a local array the compiler keeps in
    // registers over every position: added into `out` in memory, each position's adds waited
    // on the last one's store. The same adds in the same order per output, so the same bits.
    let mut c = 0;
    while c + VALUE_BLOCK <= head_dim {
        // Constant trip counts, so the loops unroll and `acc` lives in registers.
        let mut acc = [[0f32; 8]; VALUE_BLOCK / 8];
        for (t, &a) in att.iter().enumerate() {
            let v: &[f32; VALUE_BLOCK] = values[t * kv_dim + off + c..][..VALUE_BLOCK]
                .try_into()
                .expect("a block of values");
            for (i, acc) in acc.iter_mut().enumerate() {
                for j in 0..8 {
                    acc[j] += a * v[8 * i + j];
                }
            }
        }
        for (o, acc) in out[c..c + VALUE_BLOCK].chunks_exact_mut(8).zip(&acc) {
            o.copy_from_slice(acc);
        }
        c += VALUE_BLOCK;
    }
    let rest = &mut out[c..];
    rest.fill(0.0);
    if rest.is_empty() {
        return;
    }
    for (t, &a) in att.iter().enumerate() {
        let v = &values[t * kv_dim + off + c..][..rest.len()];
        for (o, &vi) in rest.iter_mut().zip(v) {
            *o += a * vi;
        }
    }
}

/// Outputs of `attend_f32`'s value pass kept in registers at once: four AVX2 registers.
const VALUE_BLOCK: usize = 32;

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums in one vector register: over fixed-size chunks (no bounds checks in
    // the loop) the compiler does vectorize it (indexed, it did not: the scalar loop was most
    // of a prefill's attention). The arithmetic per partial sum is the same either way.
    debug_assert_eq!(a.len(), b.len());
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    let mut acc = [0f32; 8];
    for (x, y) in ac.zip(bc) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
mod tests;

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
