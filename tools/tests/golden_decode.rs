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

/// llama2.c's run.c decode of `ids` (after BOS) with the pieces of `tok512.bin` read here
/// independently: `<0xXX>` pieces are their byte, and the piece right after BOS (id 1) loses
/// its leading space.
fn run_c_text(tokenizer: &Path, ids: &[u32]) -> String {
    let b = std::fs::read(tokenizer).unwrap();
    let mut pieces = Vec::new();
    let mut off = 4;
    while off < b.len() {
        let n = i32::from_le_bytes(b[off + 4..off + 8].try_into().unwrap()) as usize;
        pieces.push(b[off + 8..off + 8 + n].to_vec());
        off += 8 + n;
    }
    let mut out = Vec::new();
    let mut prev = 1;
    for &id in ids {
        let mut p: &[u8] = &pieces[id as usize];
        if prev == 1 && p.first() == Some(&b' ') {
            p = &p[1..];
        }
        let byte = std::str::from_utf8(p)
            .ok()
            .and_then(|s| s.strip_prefix("<0x")?.strip_suffix('>'))
            .filter(|h| h.len() == 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match byte {
            Some(x) => out.push(x),
            None => out.extend_from_slice(p),
        }
        prev = id;
    }
    String::from_utf8(out).unwrap()
}

/// The text of the reference decode, as the engine's `generate` and the CLI write it, is the
/// text llama2.c's run.c prints for the same ids: no leading space after BOS.
#[test]
fn stories260k_text_matches_the_reference_decoder() {
    let (Some(model), Some(tok_path), Some(reference)) = (
        common::shared("data/stories260K/stories260K.bin"),
        common::shared("data/stories260K/tok512.bin"),
        common::shared("data/stories260K/greedy_tokens.txt"),
    ) else {
        return;
    };
    let ids: Vec<u32> = std::fs::read_to_string(reference)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.split_whitespace().map(|t| t.parse::<u32>().unwrap()))
        .collect();
    let want = run_c_text(&tok_path, &ids[1..]);
    assert!(want.starts_with("Once upon a time"), "{want:?}");

    let (file, tok) = open_model(&model, Some(&tok_path)).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, EngineOptions::default()).unwrap();
    let idx = engine.take_sample_buffer().unwrap();
    let mut sampler = Sampler::new(SamplerConfig::default(), idx);
    let mut got = Vec::new();
    let params = GenerateParams {
        max_tokens: 200,
        stop: &[],
        deadline: None,
    };
    let prompt = tok.encode("", true);
    assert_eq!(prompt, [1]);
    generate(
        &mut engine,
        &mut sampler,
        &tok,
        &prompt,
        &params,
        &mut |b| {
            got.extend_from_slice(b);
            true
        },
    )
    .unwrap();
    assert_eq!(String::from_utf8(got).unwrap(), want);
    assert_eq!(tok.decode(&ids), want);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(["generate", "--model"])
        .arg(&model)
        .arg("--tokenizer")
        .arg(&tok_path)
        .args(["--prompt", "", "--max-tokens", "200"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{want}\n"));
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
