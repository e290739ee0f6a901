//! Correctness against independent references: the stories260K reference decode, and greedy
//! text and perplexity of SmolLM2-135M and Qwen2.5-Coder-0.5B on the CPU backend.

mod common;

use leanstream::engine::generate::{generate, GenerateParams};
use leanstream::engine::perplexity::perplexity;
use leanstream::engine::sample::{argmax, Sampler, SamplerConfig};
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::load::open_model;
use std::path::Path;

fn greedy_text(model: &Path, prompt: &str, max_tokens: usize) -> String {
    let (file, tok) = open_model(model, None).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, EngineOptions::default()).unwrap();
    let idx = engine.take_sample_buffer().unwrap();
    let mut sampler = Sampler::new(SamplerConfig::default(), idx);
    let ids = tok.encode(prompt, tok.add_bos_default());
    let mut out = Vec::new();
    let params = GenerateParams {
        max_tokens,
        stop: &[],
        deadline: None,
    };
    generate(&mut engine, &mut sampler, &tok, &ids, &params, &mut |b| {
        out.extend_from_slice(b);
        true
    })
    .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn wiki_ppl(model: &Path, wiki: &Path) -> f64 {
    let (file, tok) = open_model(model, None).unwrap();
    let text = std::fs::read_to_string(wiki).unwrap();
    // 512 tokens need far less than 64 KiB of text; cut at a line end.
    let cut = text[..65536].rfind('\n').unwrap();
    let tokens = tok.encode(&text[..=cut], false);
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, EngineOptions::default()).unwrap();
    perplexity(&mut engine, &tokens, 512, 1, &mut |_, _| {})
        .unwrap()
        .ppl
}

#[test]
fn stories260k_greedy_matches_reference_decode() {
    let (Some(model), Some(tok), Some(reference)) = (
        common::shared("data/stories260K/stories260K.bin"),
        common::shared("data/stories260K/tok512.bin"),
        common::shared("data/stories260K/greedy_tokens.txt"),
    ) else {
        return;
    };
    let text = std::fs::read_to_string(reference).unwrap();
    let expected: Vec<u32> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.split_whitespace().map(|t| t.parse::<u32>().unwrap()))
        .collect();
    assert_eq!(expected.len(), 201, "BOS and 200 steps");
    let (file, _tok) = open_model(&model, Some(&tok)).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, EngineOptions::default()).unwrap();
    let mut got = vec![expected[0]];
    for pos in 0..200 {
        let next = argmax(engine.forward(*got.last().unwrap(), pos));
        got.push(next);
    }
    assert_eq!(got, expected);
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let text = greedy_text(&model, "The capital of France is", 3);
    assert!(text.starts_with(" Paris."), "got {text:?}");
}

#[test]
fn smollm2_wikitext_perplexity_matches_reference() {
    let (Some(model), Some(wiki)) = (
        common::model(common::SMOLLM2),
        common::shared("data/wikitext-2/wiki.test.raw"),
    ) else {
        return;
    };
    let ppl = wiki_ppl(&model, &wiki);
    eprintln!("SmolLM2-135M Q4_1 wikitext-2 first 512-token window: ppl = {ppl:.4} (fp32 reference 20.98)");
    assert!((ppl / 20.98 - 1.0).abs() < 0.01, "ppl {ppl}");
}

#[test]
fn qwen2_writes_fibonacci() {
    let Some(model) = common::model(common::QWEN05) else {
        return;
    };
    let text = greedy_text(&model, "def fibonacci(n):", 8);
    assert!(text.starts_with("\n    if n <= 0:"), "got {text:?}");
}

#[test]
fn qwen2_wikitext_perplexity_matches_reference() {
    let (Some(model), Some(wiki)) = (
        common::model(common::QWEN05),
        common::shared("data/wikitext-2/wiki.test.raw"),
    ) else {
        return;
    };
    let ppl = wiki_ppl(&model, &wiki);
    eprintln!(
        "Qwen2.5-Coder-0.5B wikitext-2 first 512-token window: ppl = {ppl:.4} (reference 28.3)"
    );
    assert!((ppl / 28.3 - 1.0).abs() < 0.01, "ppl {ppl}");
}
