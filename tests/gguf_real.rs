//! The GGUF reader on real files (skipped with a visible line when they are absent).

mod common;

use leanstream::model::gguf::Gguf;

const MODELS: [&str; 2] = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct.gguf",
];

#[test]
fn real_models_parse() {
    for name in MODELS {
        let Some(path) = common::model(name) else {
            continue;
        };
        let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(matches!(g.version, 2 | 3));
        assert!(
            g.architecture().is_some(),
            "{name}: no general.architecture"
        );
        assert!(!g.tensors.is_empty());
        for t in &g.tensors {
            assert_eq!(g.tensor_data(t).len(), t.n_bytes, "{name}: {}", t.name);
        }
        assert!(g.tensor("token_embd.weight").is_some());
        assert!(g
            .get_str_array("tokenizer.ggml.tokens")
            .is_some_and(|v| v.len() > 1000));
    }
}

#[test]
fn tokenizer_fixture_parses() {
    let Some(path) = common::shared("data/tokenizer-fixtures/ggml-vocab-gpt-2.gguf") else {
        return;
    };
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(g.get_str_array("tokenizer.ggml.tokens").is_some());
}
