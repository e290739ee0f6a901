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

/// Softmax in place, shifted by the maximum so no exponent overflows.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
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
