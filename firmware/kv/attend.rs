//! The cache's attention: [`KvCache::attend`] over every segment of the chain, and the kernels
//! under it (int8 dots and value sums, the f32 cache's loop).

use super::cache::{head_scales, KvCache, Storage};
use super::layout::{addr, quantize_head};
use super::{GROUP, MAX_HEAD_DIM};
use crate::ops::softmax;

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
    pub(super) unsafe fn attend_avx2(
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
    pub(super) fn attend_any(
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
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
