//! Conformance against llama.cpp's tokenizer vectors (../shared/data/tokenizer-fixtures): every case
//! of the `.inp` file (strings separated by `\n__ggml_vocab_test__\n`) must encode, without BOS and
//! without parsing special tokens, to the ids on the same line of the `.out` file; and decoding must
//! give the string back.

mod common;

use std::path::Path;

use leanstream::model::gguf::Gguf;
use leanstream::tokenizer::Tokenizer;

const FIXTURES: &str = "data/tokenizer-fixtures";

fn read_cases(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(inp).expect("read .inp");
    let out = std::fs::read_to_string(out).expect("read .out");
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // The file ends with a separator: the last piece is empty and no case.
    assert_eq!(
        texts.pop(),
        Some(""),
        "fixture does not end with a separator"
    );
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "case counts differ between .inp and .out"
    );
    texts.into_iter().map(str::to_string).zip(ids).collect()
}

fn fixture(name: &str) -> Option<Vec<(String, Vec<u32>)>> {
    let inp = common::shared(&format!("{FIXTURES}/{name}.inp"))?;
    let out = common::shared(&format!("{FIXTURES}/{name}.out"))?;
    Some(read_cases(&inp, &out))
}

fn load(path: &Path) -> Tokenizer {
    let g = Gguf::open(path).expect("open gguf");
    Tokenizer::from_gguf(&g).expect("tokenizer from gguf")
}

/// Checks every case; `strip_prefix_space`: SentencePiece decodes drop the prepended space.
fn check(label: &str, tok: &Tokenizer, cases: &[(String, Vec<u32>)]) {
    let mut bad = 0;
    for (text, want) in cases {
        let got = tok.encode(text, false);
        if &got != want {
            bad += 1;
            eprintln!("{label}: MISMATCH for {text:?}\n  want {want:?}\n  got  {got:?}");
        }
        let back = tok.decode(&got);
        if &back != text {
            bad += 1;
            eprintln!("{label}: ROUND-TRIP for {text:?} gave {back:?}");
        }
    }
    eprintln!(
        "{label}: {}/{} fixture cases match",
        cases.len() - bad.min(cases.len()),
        cases.len()
    );
    assert_eq!(bad, 0, "{label}: {bad} failures");
}

#[test]
fn gpt2_vocab_matches_llama_cpp() {
    let Some(cases) = fixture("ggml-vocab-gpt-2.gguf") else {
        return;
    };
    let Some(vocab) = common::shared(&format!("{FIXTURES}/ggml-vocab-gpt-2.gguf")) else {
        return;
    };
    check("gpt-2", &load(&vocab), &cases);
}

#[test]
fn llama_spm_vocab_matches_llama_cpp() {
    let Some(cases) = fixture("ggml-vocab-llama-spm.gguf") else {
        return;
    };
    let Some(vocab) = common::shared(&format!("{FIXTURES}/ggml-vocab-llama-spm.gguf")) else {
        return;
    };
    check("llama-spm", &load(&vocab), &cases);
}

#[test]
fn qwen2_vocab_matches_llama_cpp() {
    let Some(cases) = fixture("ggml-vocab-qwen2.gguf") else {
        return;
    };
    let Some(model) = common::model("qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    check("qwen2", &load(&model), &cases);
}

#[test]
fn llama_bpe_vocab_is_not_available() {
    // The llama-bpe vectors exist but their vocabulary (ggml-vocab-llama-bpe.gguf, Llama 3's) is not
    // among the shared files nor the fetched models.
    eprintln!("skipped: ggml-vocab-llama-bpe.gguf not found (llama-bpe vectors need the Llama 3 vocabulary)");
}
