//! [`KvCache`], the cache's public type: its storage, the segment chain it grows token by token,
//! and the key scales (its attention is in `attend`).

use super::cost::Policy;
use super::layout::{addr, quantize_head, Layout, Segment, Shape};
use super::{KvPrecision, GROUP, MAX_HEAD_DIM, MAX_SEGMENTS};
use crate::model::ggml::f32_to_f16;

/// The storage of a cache, carved from the KV arena at boot (or any buffers, for tests and the
/// calibration benchmark).
pub enum Storage<'a> {
    /// Keys and values `[layer][kv_head][position][head_dim]`: the rows of one KV head lie
    /// one after another, so its attention reads one stream (token-major rows, `kv_dim`
    /// apart, left each head's reads a fraction of every line pair and page the hardware's
    /// prefetchers fetched). `kbuf`/`vbuf`: the rows the forward pass writes a token's K and V
    /// into (`kv_dim` each), stored per head by `commit`.
    F32 {
        k: &'a mut [f32],
        v: &'a mut [f32],
        kbuf: &'a mut [f32],
        vbuf: &'a mut [f32],
    },
    /// As `F32`, the values IEEE half (their bits), rounded to nearest even by `commit`.
    F16 {
        k: &'a mut [u16],
        v: &'a mut [u16],
        kbuf: &'a mut [f32],
        vbuf: &'a mut [f32],
    },
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
    pub(super) store: Storage<'a>,
    pub(super) segs: heapless::Vec<Segment, MAX_SEGMENTS>,
    policy: Policy,
    /// Tokens in a row the best other layout has won by the margin.
    streak: u32,
    /// Per layer and K channel (n_layers x kv_dim): the int8 cache stores K divided by it and
    /// multiplies queries by it, so q.k is unchanged while outlier channels stop swamping their
    /// group's scale (see [`key_scales_from_bias`]).
    pub(super) key_scale: Option<&'a [f32]>,
    /// Whether `attend` runs its AVX2 build: the engine's kernel choice, made once at boot and
    /// set with [`KvCache::set_avx2`], which keeps it false where the CPU lacks the features.
    pub(super) avx2: bool,
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
            Storage::F32 { k, v, kbuf, vbuf } => {
                let n = shape.n_layers * shape.context * shape.kv_dim();
                assert!(k.len() >= n && v.len() >= n, "f32 KV storage too small");
                assert!(kbuf.len() == shape.kv_dim() && vbuf.len() == shape.kv_dim());
            }
            Storage::F16 { k, v, kbuf, vbuf } => {
                let n = shape.n_layers * shape.context * shape.kv_dim();
                assert!(k.len() >= n && v.len() >= n, "f16 KV storage too small");
                assert!(kbuf.len() == shape.kv_dim() && vbuf.len() == shape.kv_dim());
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
            Storage::F16 { .. } => KvPrecision::F16,
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
            (_, KvPrecision::F32 | KvPrecision::F16) => Layout::TokenMajor,
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

    /// The rows the forward pass writes a position's key and value of a layer into; `commit`
    /// stores them.
    pub fn rows(&mut self) -> (&mut [f32], &mut [f32]) {
        match &mut self.store {
            Storage::F32 { kbuf, vbuf, .. }
            | Storage::F16 { kbuf, vbuf, .. }
            | Storage::I8 { kbuf, vbuf, .. } => (&mut kbuf[..], &mut vbuf[..]),
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
    /// segment holding `pos`; f32, f16: each head's part to its row).
    pub fn commit(&mut self, l: usize, pos: usize) {
        let s = self.shape;
        let (hd, g) = (s.head_dim, s.groups());
        let Some((seg, i)) = self.find(pos) else {
            panic!("position {pos} was not begun");
        };
        let key_scale = self.key_scale;
        if let Storage::F32 { k, v, kbuf, vbuf } = &mut self.store {
            for h in 0..s.kv_heads {
                let at = f32_row(&s, l, h, pos);
                k[at..at + hd].copy_from_slice(&kbuf[h * hd..][..hd]);
                v[at..at + hd].copy_from_slice(&vbuf[h * hd..][..hd]);
            }
        }
        if let Storage::F16 { k, v, kbuf, vbuf } = &mut self.store {
            for h in 0..s.kv_heads {
                let at = f32_row(&s, l, h, pos);
                for (o, &x) in k[at..at + hd].iter_mut().zip(&kbuf[h * hd..][..hd]) {
                    *o = f32_to_f16(x);
                }
                for (o, &x) in v[at..at + hd].iter_mut().zip(&vbuf[h * hd..][..hd]) {
                    *o = f32_to_f16(x);
                }
            }
        }
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
}

/// Where the float (f32, f16) cache's row of KV head `h` at position `pos` of layer `l` starts.
#[inline(always)]
pub(super) fn f32_row(s: &Shape, l: usize, h: usize, pos: usize) -> usize {
    ((l * s.kv_heads + h) * s.context + pos) * s.head_dim
}

/// Key head `h` of layer `l`'s scales, when keys are scaled.
#[inline(always)]
pub(super) fn head_scales<'b>(
    scales: Option<&'b [f32]>,
    s: &Shape,
    l: usize,
    h: usize,
) -> Option<&'b [f32]> {
    scales.map(|f| &f[l * s.kv_dim() + h * s.head_dim..][..s.head_dim])
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
