//! ModelFile on the real files (skipped with a visible line when absent).

mod common;

use leanstream::model::{Arch, GgmlType, ModelFile, RopeStyle};

#[test]
fn smollm2_hyper() {
    let Some(p) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let m = ModelFile::open(&p).unwrap();
    let h = m.hyper().unwrap();
    assert_eq!(h.arch, Arch::Llama);
    assert_eq!(
        (
            h.n_layers,
            h.dim,
            h.hidden_dim,
            h.n_heads,
            h.n_kv_heads,
            h.head_dim
        ),
        (30, 576, 1536, 9, 3, 64)
    );
    assert_eq!((h.vocab_size, h.ctx_train), (49152, 8192));
    assert_eq!(
        (h.rope_base, h.rope_style),
        (100000.0, RopeStyle::AdjacentPairs)
    );
    assert!(h.tied_output && !h.qkv_bias);
    m.validate(&h).unwrap();
    assert_eq!(m.tensor("token_embd.weight").unwrap().ty, GgmlType::Q8_0);
}

#[test]
fn qwen25_hyper() {
    let Some(p) = common::model("qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    let m = ModelFile::open(&p).unwrap();
    let h = m.hyper().unwrap();
    assert_eq!(h.arch, Arch::Qwen2);
    assert_eq!(
        (
            h.n_layers,
            h.dim,
            h.hidden_dim,
            h.n_heads,
            h.n_kv_heads,
            h.head_dim
        ),
        (24, 896, 4864, 14, 2, 64)
    );
    assert_eq!((h.vocab_size, h.ctx_train), (151936, 32768));
    assert_eq!(
        (h.rope_base, h.rope_style),
        (1000000.0, RopeStyle::HalfSplit)
    );
    assert!(!h.tied_output && h.qkv_bias);
    m.validate(&h).unwrap();
}

#[test]
fn stories260k() {
    let Some(p) = common::shared("data/stories260K/stories260K.bin") else {
        return;
    };
    let m = ModelFile::open(&p).unwrap();
    assert!(matches!(m, ModelFile::Llama2c(_)));
    let h = m.hyper().unwrap();
    assert_eq!(h.arch, Arch::Llama);
    assert_eq!(
        (
            h.dim,
            h.hidden_dim,
            h.n_layers,
            h.n_heads,
            h.n_kv_heads,
            h.head_dim
        ),
        (64, 172, 5, 8, 4, 8)
    );
    assert_eq!((h.vocab_size, h.ctx_train, h.tied_output), (512, 512, true));
    m.validate(&h).unwrap();
    let t = m.tensor("blk.4.ffn_up.weight").unwrap();
    assert_eq!((t.cols, t.rows), (64, 172));
    let n = m.tensor("output_norm.weight").unwrap();
    assert!(n
        .data
        .chunks_exact(4)
        .all(|c| f32::from_le_bytes(c.try_into().unwrap()).is_finite()));
    // A truncated copy is refused with a clear message.
    let bytes = std::fs::read(&p).unwrap();
    let e = ModelFile::from_bytes(bytes[..bytes.len() - 8].to_vec())
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated") && e.contains("1056540"), "{e}");
}
