//! A small synthetic model whose matrices are K-quants (and Q5_1, Q4_1), for the tests that
//! compare their kernels at model level: the GPU against the CPU (cuda.rs) and the CPU's two
//! input-scale forms (lowbit.rs).

use leanstream::model::ggml::GgmlType;
use leanstream::model::gguf::build::Builder;
use leanstream::model::ModelFile;

/// Bytes of a random matrix of `ty` (rows x cols), its blocks' scales set so that weights are
/// of the order of 1e-2 and about centred: Q4_K, Q5_K (d, dmin), Q6_K (d), Q5_1 and Q4_1 (d, m).
fn kquant_matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        // xorshift64*
        *seed ^= *seed >> 12;
        *seed ^= *seed << 25;
        *seed ^= *seed >> 27;
        (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
    };
    let n = rows * cols / ty.block_elems() * ty.block_bytes();
    let mut data: Vec<u8> = (0..n).map(|_| next()).collect();
    let f16 = |v: f32| leanstream::model::ggml::f32_to_f16(v).to_le_bytes();
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        let (d, second, d_at) = match ty {
            GgmlType::Q4_K => (1e-4, Some(7.5e-4), 0),
            GgmlType::Q5_K => (5e-5, Some(7.75e-4), 0),
            GgmlType::Q6_K => (2e-5, None, 208),
            GgmlType::Q5_1 => (1e-3, Some(-1.55e-2), 0),
            GgmlType::Q4_1 => (2e-3, Some(-1.5e-2), 0),
            _ => panic!("not a type of this test: {}", ty.name()),
        };
        blk[d_at..d_at + 2].copy_from_slice(&f16(d));
        if let Some(v) = second {
            blk[2..4].copy_from_slice(&f16(v));
        }
    }
    data
}

/// A two-layer llama model (width 512, FFN 1024, 8 heads of 64, 2 kv heads, 1024 tokens) whose
/// matrices are K-quants and Q5_1, mixed as a Q4_K_M file mixes them (q, k Q4_K with v Q6_K,
/// so they launch apart; gate/up stacked tile by tile; an embedding of Q4_K, the output Q6_K),
/// and one Q4_1 matrix (the classic kernels' loads share the K-quants' code).
pub fn kquant_model() -> ModelFile {
    use GgmlType::*;
    let (d, f, v, layers) = (512usize, 1024usize, 1024usize, 2);
    let kv = d / 8 * 2;
    let mut b = Builder::default();
    b.kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", layers as u32)
        .kv_u32("llama.embedding_length", d as u32)
        .kv_u32("llama.feed_forward_length", f as u32)
        .kv_u32("llama.attention.head_count", 8)
        .kv_u32("llama.attention.head_count_kv", 2)
        .kv_u32("llama.context_length", 256)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut m = |b: &mut Builder, name: &str, ty: GgmlType, rows: usize, cols: usize| {
        let data = kquant_matrix(ty, rows, cols, &mut seed);
        b.tensor(name, &[cols as u64, rows as u64], ty, data);
    };
    m(&mut b, "token_embd.weight", Q4_K, v, d);
    m(&mut b, "output.weight", Q6_K, v, d);
    b.tensor_f32("output_norm.weight", &[d as u64], &vec![1.0; d]);
    let types = [
        [Q4_K, Q4_K, Q6_K, Q4_K, Q4_K, Q4_K, Q6_K],
        [Q5_K, Q5_K, Q4_1, Q5_1, Q5_K, Q5_K, Q5_1],
    ];
    for (l, t) in types.iter().enumerate() {
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        b.tensor_f32(&p("attn_norm"), &[d as u64], &vec![1.0; d]);
        b.tensor_f32(&p("ffn_norm"), &[d as u64], &vec![1.0; d]);
        m(&mut b, &p("attn_q"), t[0], d, d);
        m(&mut b, &p("attn_k"), t[1], kv, d);
        m(&mut b, &p("attn_v"), t[2], kv, d);
        m(&mut b, &p("attn_output"), t[3], d, d);
        m(&mut b, &p("ffn_gate"), t[4], f, d);
        m(&mut b, &p("ffn_up"), t[5], f, d);
        m(&mut b, &p("ffn_down"), t[6], d, f);
    }
    ModelFile::from_bytes(b.build()).expect("the K-quant model opens")
}
