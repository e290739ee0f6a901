//! The CPU's FFN over blocks of a flash image, in f32 from the image's own rows: what the GPU's
//! streamed FFN (backend/cuda/stream_layer.rs) is checked against before it is timed.

use leanstream::model::flash::FlashImage;
use leanstream::model::ggml::dequantize_row;

/// Layer `layer`'s FFN over `blocks` (layer-local): each neuron's silu(gate)·up times its down
/// column where |silu(gate)·up| >= thr.
pub fn block_ffn(img: &FlashImage, layer: usize, blocks: &[u32], x: &[f32], thr: f32) -> Vec<f32> {
    let dim = x.len();
    let (mut g, mut u, mut d) = (vec![0f32; dim], vec![0f32; dim], vec![0f32; dim]);
    let mut out = vec![0f32; dim];
    for &b in blocks {
        let r = img.block_rows(layer, b as usize);
        for i in 0..r.gate.rows {
            dequantize_row(r.gate.ty, r.gate.row(i), &mut g);
            dequantize_row(r.up.ty, r.up.row(i), &mut u);
            dequantize_row(r.down.ty, r.down.row(i), &mut d);
            let sg: f32 = g.iter().zip(x).map(|(a, b)| a * b).sum();
            let su: f32 = u.iter().zip(x).map(|(a, b)| a * b).sum();
            let a = sg / (1.0 + (-sg).exp()) * su;
            if a.abs() >= thr {
                for (o, v) in out.iter_mut().zip(&d) {
                    *o += a * v;
                }
            }
        }
    }
    out
}

/// The largest |got - want| over the largest |want|.
pub fn max_rel(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}
