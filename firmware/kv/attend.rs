//! The cache's attention: [`KvCache::attend`] over every segment of the chain, and the kernels
//! under it (int8 dots and value sums, the float caches' loop).

use super::cache::{f32_row, head_scales, KvCache, Storage};
use super::layout::{addr, quantize_head};
use super::{GROUP, MAX_HEAD_DIM};
use crate::model::ggml::f16_to_f32;
use crate::ops::softmax;

#[cfg(target_arch = "x86_64")]
mod x86;

impl KvCache<'_> {
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
        self.attend_heads(l, kv_head, q, pos, att, 0, out)
    }

    /// [`Self::attend`] for several query heads of KV head `kv_head` at once: `qs` holds them
    /// one after another, `out` gets their outputs alike, and head `h`'s weights go to
    /// `att[h * att_stride..][..pos + 1]`. Each head's results are the bits `attend` gives it;
    /// the float caches read each key and value row once for all the heads (a task a head read
    /// its KV head's rows once per query head: six times over at Qwen2.5-1.5B's grouping).
    #[allow(clippy::too_many_arguments)]
    pub fn attend_heads(
        &self,
        l: usize,
        kv_head: usize,
        qs: &[f32],
        pos: usize,
        att: &mut [f32],
        att_stride: usize,
        out: &mut [f32],
    ) {
        let hd = self.shape.head_dim;
        let n = qs.len() / hd;
        assert!(
            qs.len() == n * hd && out.len() == n * hd && n > 0,
            "attention over whole heads: {} query and {} output values, heads of {hd}",
            qs.len(),
            out.len()
        );
        assert!(
            n == 1 || att_stride > pos,
            "each head's weights need {} places, {att_stride} apart",
            pos + 1
        );
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `set_avx2` sets the flag only where the CPU has AVX2, FMA and F16C.
            return unsafe { self.attend_avx2(l, kv_head, qs, pos, att, att_stride, out) };
        }
        self.attend_any(l, kv_head, qs, pos, att, att_stride, out)
    }

    /// The same code compiled for AVX2: 8-wide loops over the head and the int8 groups. Rust
    /// never fuses or reorders float operations, so the results equal the baseline build's
    /// bit for bit (tested).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attend_avx2(
        &self,
        l: usize,
        kv_head: usize,
        qs: &[f32],
        pos: usize,
        att: &mut [f32],
        att_stride: usize,
        out: &mut [f32],
    ) {
        self.attend_with::<true>(l, kv_head, qs, pos, att, att_stride, out)
    }

    /// The baseline build of the attention (any CPU). A wrapper, so that `attend_with::<true>`,
    /// which needs AVX2, is reachable only through `attend_avx2`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_any(
        &self,
        l: usize,
        kv_head: usize,
        qs: &[f32],
        pos: usize,
        att: &mut [f32],
        att_stride: usize,
        out: &mut [f32],
    ) {
        self.attend_with::<false>(l, kv_head, qs, pos, att, att_stride, out)
    }

    /// `AVX2`: called from [`Self::attend_avx2`] only (so the CPU has AVX2, FMA and F16C):
    /// the float cache's scores take the AVX2 kernel, and f16 rows its conversions.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn attend_with<const AVX2: bool>(
        &self,
        l: usize,
        kv_head: usize,
        qs: &[f32],
        pos: usize,
        att: &mut [f32],
        att_stride: usize,
        out: &mut [f32],
    ) {
        let s = &self.shape;
        let hd = s.head_dim;
        match &self.store {
            Storage::F32 { k, v, .. } => {
                let (at, n) = (f32_row(s, l, kv_head, 0), s.context * hd);
                let (k, v) = (&k[at..at + n], &v[at..at + n]);
                attend_float::<f32, AVX2>(qs, hd, k, v, pos, att, att_stride, out)
            }
            Storage::F16 { k, v, .. } => {
                let (at, n) = (f32_row(s, l, kv_head, 0), s.context * hd);
                let (k, v) = (&k[at..at + n], &v[at..at + n]);
                attend_float::<u16, AVX2>(qs, hd, k, v, pos, att, att_stride, out)
            }
            // The int8 cache's heads one at a time (its rows are a quarter of f32's).
            Storage::I8 { k, v, ks, vs, .. } => {
                for (h, (q, o)) in qs
                    .chunks_exact(hd)
                    .zip(out.chunks_exact_mut(hd))
                    .enumerate()
                {
                    let a = &mut att[h * att_stride..];
                    self.attend_i8(k, v, ks, vs, l, kv_head, q, pos, a, o)
                }
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

/// Query heads an attention task takes, all of one KV head (a divisor of `group`, the query
/// heads a KV head has), for `units` KV heads to attend (times the tokens of a batch) over
/// `threads` (tasks are claimed in turn): the least time on the busiest thread, counting a
/// head in a task of `sub` as `1 + 1/sub`, its own arithmetic plus its share of reading the
/// rows (`cargo bench --bench attention`: a head alone 1.4-1.6x the time of one of 3 or 6 a
/// task, docs/BENCHMARKS.md). Qwen2.5-1.5B's 6 heads a KV head take one task per KV head at 2
/// threads, 2 heads a task at 8, one at 16; SmolLM2's 3 take one task per KV head at 2.
pub fn heads_per_task(group: usize, units: usize, threads: usize) -> usize {
    let cost = |sub: usize| {
        let busiest = (units * (group / sub)).div_ceil(threads.max(1)) * sub;
        busiest as f64 * (1.0 + 1.0 / sub as f64)
    };
    (1..=group)
        .filter(|sub| group.is_multiple_of(*sub))
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(b.cmp(&a)))
        .unwrap_or(1)
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

/// A float cache's stored value: f32, or IEEE half (its bits). Rows of either are read as
/// f32 (a half converts exactly), so an f16 cache's attention is the f32 code over the
/// converted values, bit for bit.
pub(super) trait FloatValue: Copy {
    /// Whether the value is a half (the AVX2 loads convert it).
    #[cfg(target_arch = "x86_64")]
    const HALF: bool;
    fn f32(self) -> f32;
}

impl FloatValue for f32 {
    #[cfg(target_arch = "x86_64")]
    const HALF: bool = false;
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl FloatValue for u16 {
    #[cfg(target_arch = "x86_64")]
    const HALF: bool = true;
    #[inline(always)]
    fn f32(self) -> f32 {
        f16_to_f32(self)
    }
}

/// The first eight values of `x` as f32: with `AVX2` (the CPU has it, and F16C) one load, a
/// half's a conversion.
#[inline(always)]
fn load8<E: FloatValue, const AVX2: bool>(x: &[E]) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 is true only under `attend_avx2`, which runs where the CPU has AVX2,
        // FMA and F16C.
        return unsafe { x86::load8(x) };
    }
    std::array::from_fn(|j| x[j].f32())
}

/// The float cache's attention for one or more query heads of one KV head (`qs`, heads of
/// `head_dim` values) over its rows (`keys`, `values`: `head_dim` values a position, f32 or
/// f16): per head, the classic engine's arithmetic (golden results stay exact), but each key
/// row is dotted with every head while it is in L1, and the values are summed a tile of
/// positions at a time, every head over the tile before the next, so each row comes from
/// memory once for all the heads.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_float<E: FloatValue, const AVX2: bool>(
    qs: &[f32],
    head_dim: usize,
    keys: &[E],
    values: &[E],
    pos: usize,
    att: &mut [f32],
    att_stride: usize,
    out: &mut [f32],
) {
    let n = qs.len() / head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let weights = |h: usize| h * att_stride..h * att_stride + pos + 1;
    // Scores `SCORE_BLOCK` positions at a time where the head is whole chunks of 8, then the
    // rest one at a time: each `dot(q, k) * scale`, the same bits either way.
    let mut t = 0;
    if head_dim.is_multiple_of(8) {
        while t + SCORE_BLOCK <= pos + 1 {
            let rows = &keys[t * head_dim..][..SCORE_BLOCK * head_dim];
            for (h, q) in qs.chunks_exact(head_dim).enumerate() {
                let s = dots_of_rows::<E, AVX2>(q, rows);
                for (a, s) in att[h * att_stride + t..][..SCORE_BLOCK].iter_mut().zip(s) {
                    *a = s * scale;
                }
            }
            t += SCORE_BLOCK;
        }
    }
    for t in t..=pos {
        let k = &keys[t * head_dim..][..head_dim];
        for (h, q) in qs.chunks_exact(head_dim).enumerate() {
            att[h * att_stride + t] = dot_of::<E, AVX2>(q, k) * scale;
        }
    }
    for h in 0..n {
        softmax(&mut att[weights(h)]);
    }
    // The weighted values, 32 outputs at a time in a local array the compiler keeps in
    // registers over a tile's positions: added into `out` in memory, each position's adds
    // waited on the last one's store. Each output gets the same adds in the same order
    // (position by position, from 0.0), tiles or not, so the same bits.
    out.fill(0.0);
    let mut t0 = 0;
    while t0 <= pos {
        let tile = t0..(t0 + VALUE_TILE).min(pos + 1);
        let rows = &values[t0 * head_dim..];
        for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
            add_weighted_values::<E, AVX2>(&att[weights(h)][tile.clone()], rows, o);
        }
        t0 = tile.end;
    }
}

/// `out += sum over i of a[i] * row i`, the rows `out.len()` values each from the start of
/// `values`, the adds of each output in row order.
#[inline(always)]
fn add_weighted_values<E: FloatValue, const AVX2: bool>(a: &[f32], values: &[E], out: &mut [f32]) {
    let row = out.len();
    let mut c = 0;
    while c + VALUE_BLOCK <= out.len() {
        // Constant trip counts, so the loops unroll and `acc` lives in registers.
        let start: &[f32; VALUE_BLOCK] = out[c..][..VALUE_BLOCK].try_into().expect("a block");
        let mut acc: [[f32; 8]; VALUE_BLOCK / 8] =
            std::array::from_fn(|b| std::array::from_fn(|j| start[8 * b + j]));
        for (i, &w) in a.iter().enumerate() {
            let v = &values[i * row + c..][..VALUE_BLOCK];
            for (b, acc) in acc.iter_mut().enumerate() {
                let v = load8::<E, AVX2>(&v[8 * b..]);
                for j in 0..8 {
                    acc[j] += w * v[j];
                }
            }
        }
        for (o, acc) in out[c..c + VALUE_BLOCK].chunks_exact_mut(8).zip(&acc) {
            o.copy_from_slice(acc);
        }
        c += VALUE_BLOCK;
    }
    let rest = &mut out[c..];
    for (i, &w) in a.iter().enumerate() {
        let v = &values[i * row + c..][..rest.len()];
        for (o, &vi) in rest.iter_mut().zip(v) {
            *o += w * vi.f32();
        }
    }
}

/// [`dot`] of `q` with each of the `SCORE_BLOCK` rows at the start of `rows`: with `AVX2`
/// (the CPU has it) the kernel that sums the eight dots together, else one at a time.
#[inline(always)]
fn dots_of_rows<E: FloatValue, const AVX2: bool>(q: &[f32], rows: &[E]) -> [f32; SCORE_BLOCK] {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 is true only under `attend_avx2`, which runs where the CPU has AVX2,
        // FMA and F16C.
        return unsafe { x86::dots_of_rows(q, rows) };
    }
    let hd = q.len();
    std::array::from_fn(|p| dot_of::<E, AVX2>(q, &rows[p * hd..][..hd]))
}

/// Key rows scored together: eight dots' sums are one transpose and seven vector adds.
const SCORE_BLOCK: usize = 8;

/// Positions whose value rows every head adds before the next tile: 16 rows of a 128-wide
/// head are 8 KiB, a quarter of an L1 (8 to 64 measured: 16 the fastest at both shapes).
const VALUE_TILE: usize = 16;

/// Outputs of `attend_f32`'s value pass kept in registers at once: eight AVX2 registers, so
/// eight independent add chains (32, four chains, was ~4% slower at both shapes).
const VALUE_BLOCK: usize = 64;

/// [`dot`] of a query with a cache row of either float type (the same bits as `dot` over
/// the row converted to f32).
#[inline(always)]
fn dot_of<E: FloatValue, const AVX2: bool>(a: &[f32], b: &[E]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    let mut acc = [0f32; 8];
    for (x, y) in ac.zip(bc) {
        let y = load8::<E, AVX2>(y);
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        sum += x * y.f32();
    }
    sum
}

/// The dot `attend` gives a query and an f32 row (the tests' reference).
#[cfg(test)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_of::<f32, false>(a, b)
}
