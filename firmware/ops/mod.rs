//! The small vector operations of a llama-family forward pass, one copy each: RMS norm,
//! softmax, SiLU, residual add and rotary position embedding. Every layer above uses these
//! (the engine's forward pass, the KV cache's attention, the sparse FFN, the offline tools),
//! so they sit below all of them and import nothing but the model's rope style.

use crate::model::RopeStyle;

/// `out = x / rms(x) * weight`, with `eps` inside the root.
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(weight) {
        *o = xi * inv * wi;
    }
}

/// Softmax in place, shifted by the maximum so no exponent overflows. Attention's: each of a
/// head's weights over its positions. The exponentials are [`exp`] (inlined, so the loop is
/// vector code; libm's `expf`, a call a weight, was a fifth of long-context attention) and the
/// sum is eight running sums added in order at the end: fixed arithmetic, so every build and
/// CPU gives the same bits. Inlined, so that it is built for the caller's CPU features.
#[inline(always)]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (s, v) in lanes.iter_mut().zip(c) {
            *s += v;
        }
    }
    let sum = lanes.iter().chain(rest).fold(0.0, |s, v| s + v);
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// `e^x`, within 2 ulp of libm's `expf` for `x` in [-87, 88] (0 below -87, 88's value above
/// it, NaN for NaN): Cephes' `expf`, `x = n ln 2 + r` and a degree-7 polynomial for `e^r`, in
/// plain multiplies and adds (never fused), so it vectorizes and every build gives its bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first exact in few bits, so `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it and taking it away rounds to the nearest integer (ties to even),
    // with no rounding instruction that an older x86 lacks.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = p * (r * r) + r + 1.0;
    // 2^n, n in [-126, 127]: the exponent field alone.
    let two_n = f32::from_bits(((n as i32 + 127) << 23) as u32);
    let y = er * two_n;
    if x < -87.0 {
        0.0
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// `x += y`, element by element (the residual stream).
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// SiLU, `x * sigmoid(x)`: the gate's activation in SwiGLU.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Rotary position embedding's cos and sin of pair `i` at `pos`, computed once per token for
/// every layer and head (they depend on the position only).
pub fn rope_angles(cos: &mut [f32], sin: &mut [f32], head_dim: usize, pos: usize, base: f32) {
    for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
        let freq = base.powf(-((2 * i) as f32) / head_dim as f32);
        (*s, *c) = (pos as f32 * freq).sin_cos();
    }
}

/// Rotary position embedding over every head in `x` (heads of `2 * cos.len()` values), by the
/// angles of [`rope_angles`]. Llama-style GGUF and llama2.c rotate adjacent pairs (2i, 2i+1);
/// qwen2 (NEOX) rotates (i, i + head_dim/2).
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    for head in x.chunks_exact_mut(2 * half) {
        for i in 0..half {
            let (sin, cos) = (sin[i], cos[i]);
            let (a, b) = style.pair(i, half);
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against libm over the whole range attention uses (and past it), one value in 97.
    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let ulp = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
        let mut worst = (0, 0.0f32);
        let mut x = -87.0f32;
        while x <= 88.0 {
            let d = ulp(exp(x), x.exp());
            if d > worst.0 {
                worst = (d, x);
            }
            x += 97.0 / 1_000_000.0;
        }
        assert!(worst.0 <= 2, "exp({}) is {} ulp off", worst.1, worst.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = [1.0f32, 3.0, 2.0, -1000.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[2] && x[2] > x[0] && x[3] == 0.0);
    }

    #[test]
    fn rmsnorm_of_a_constant_is_the_weight() {
        let mut out = [0.0f32; 4];
        rmsnorm(&mut out, &[2.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_keeps_norms() {
        let (mut cos, mut sin) = ([0.0f32; 2], [0.0f32; 2]);
        rope_angles(&mut cos, &mut sin, 4, 0, 10000.0);
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut x, &cos, &sin, RopeStyle::AdjacentPairs);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        rope_angles(&mut cos, &mut sin, 4, 7, 10000.0);
        rope(&mut x, &cos, &sin, RopeStyle::AdjacentPairs);
        let n = |a: f32, b: f32| (a * a + b * b).sqrt();
        assert!((n(x[0], x[1]) - n(1.0, 2.0)).abs() < 1e-5);
        assert!((n(x[2], x[3]) - n(3.0, 4.0)).abs() < 1e-5);
    }

    #[test]
    fn silu_is_x_times_sigmoid() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(2.0) - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
    }
}
