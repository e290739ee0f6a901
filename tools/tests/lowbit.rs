//! The low-bit engine end to end: bad precision, packing, KV layout and kvcost tables are clear
//! errors; on SmolLM2 the three w4 packings give bit-identical logits, and one short WikiText-2
//! window stays within bounds of the model's own precision (the full 8-window report for both
//! models is `scripts/lowbit-quality.sh`, in docs/LOWBIT.md).

mod common;

use leanstream::engine::perplexity::perplexity;
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::kv::{CostModel, KvPrecision, Policy};
use leanstream::load::open_model;
use leanstream::quant::{Packing, Precision};
use std::process::Command;

fn leanstream(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_refused(args: &[&str], needle: &str) {
    let (code, err) = leanstream(args);
    assert!(code != 0, "args {args:?} succeeded");
    assert!(
        err.contains(needle),
        "args {args:?}: expected {needle:?} in {err}"
    );
    assert!(!err.contains("panicked"), "args {args:?}: {err}");
}

#[test]
fn bad_low_bit_options_are_clear_errors() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let (m, t) = (model.to_str().unwrap(), tok.to_str().unwrap());
    let base = [
        "generate",
        "--model",
        m,
        "--tokenizer",
        t,
        "--prompt",
        "",
        "--max-tokens",
        "2",
    ];
    let with = |extra: &[&'static str]| -> Vec<String> {
        base.iter()
            .map(|s| s.to_string())
            .chain(extra.iter().map(|s| s.to_string()))
            .collect()
    };
    let run = |extra: &[&'static str], needle: &str| {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&args, needle);
    };
    run(&["--precision", "w2a8"], "unknown precision 'w2a8'");
    run(&["--packing", "zigzag"], "unknown packing 'zigzag'");
    run(&["--kv-layout", "diagonal"], "unknown KV layout 'diagonal'");

    // A kvcost table made for this model loads; damaged, for another model, or not a table: refused.
    let dir = std::env::temp_dir().join(format!("leanstream-lowbit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (file, _) = open_model(&model, Some(&tok)).unwrap();
    let id = leanstream::tables::model_identity(&file);
    let good = leanstream::tables::encode("kvcost", 1, id, &CostModel::default());
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let ok = write("good.bin", &good);
    let mut damaged = good.clone();
    let n = damaged.len();
    damaged[n - 2] ^= 0x10;
    let damaged = write("damaged.bin", &damaged);
    let other = write(
        "other.bin",
        &leanstream::tables::encode("kvcost", 1, id ^ 1, &CostModel::default()),
    );
    let junk = write("junk.bin", b"not a table at all");
    let bad_values = write(
        "nan.bin",
        &leanstream::tables::encode(
            "kvcost",
            1,
            id,
            &CostModel {
                bandwidth: f64::NAN,
                ..CostModel::default()
            },
        ),
    );
    let args = with(&["--kv-cost"]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push(&ok);
    let (code, err) = leanstream(&args);
    assert_eq!(code, 0, "a good table: {err}");
    for (p, needle) in [
        (&damaged, "checksum"),
        (&other, "another model"),
        (&junk, "not a LeanStream table"),
        (&bad_values, "invalid constants"),
    ] {
        *args.last_mut().unwrap() = p;
        assert_refused(&args, needle);
    }
}

fn ppl(model: &std::path::Path, precision: Precision, packing: Packing, n: usize) -> f64 {
    let (file, tok) = open_model(model, None).unwrap();
    let text =
        std::fs::read_to_string(common::shared("data/wikitext-2/wiki.test.raw").unwrap()).unwrap();
    let tokens = tok.encode(&text[..20000], false);
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(
        &mut arenas,
        &file,
        EngineOptions {
            threads: 2,
            precision,
            packing,
            kv_policy: Policy::Adaptive(CostModel {
                persist: 8,
                margin: 0.0,
                ..CostModel::default()
            }),
            ..EngineOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        engine.kv_precision() == KvPrecision::I8,
        precision.int8_kv(),
        "{precision}"
    );
    perplexity(&mut engine, &tokens, n, 1, &mut |_, _| {})
        .unwrap()
        .ppl
}

/// One window of 64 tokens: w8a8 within 2% and w4a8 within 35% of the model's own types (a
/// short window is noisy, and SmolLM2 is stored Q4_1, so w4a8 is a second 4-bit rounding; seen:
/// native 67.04, w8a8 65.83, w4a8 68.03 with q/k/v in w8; docs/LOWBIT.md has the 8-window
/// figures), and every w4
/// packing gives exactly the same perplexity.
#[test]
fn smollm2_short_window_quality_and_identical_packings() {
    if common::shared("data/wikitext-2/wiki.test.raw").is_none() {
        return;
    }
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let n = 64;
    let native = ppl(&model, Precision::Native, Packing::Interleaved, n);
    let w8 = ppl(&model, Precision::W8a8, Packing::Interleaved, n);
    let w4: Vec<f64> = Packing::ALL
        .iter()
        .map(|&p| ppl(&model, Precision::W4a8, p, n))
        .collect();
    eprintln!("ppl over {n} tokens: native {native:.4}, w8a8 {w8:.4}, w4a8 {w4:?}");
    assert!(w8 <= native * 1.02, "w8a8 {w8} against native {native}");
    assert!(
        w4[0] <= native * 1.35,
        "w4a8 {} against native {native}",
        w4[0]
    );
    assert!(
        w4.iter().all(|&p| p.to_bits() == w4[0].to_bits()),
        "packings differ: {w4:?}"
    );
}

/// Logits of the first `n` tokens of a prompt, booted at `precision`, and how many matrices boot
/// requantized.
fn logits(model: &std::path::Path, precision: Precision, n: usize) -> (Vec<Vec<f32>>, usize) {
    logits_with(model, precision, false, n)
}

/// `logits`, with `EngineOptions::native_classic` set as given.
fn logits_with(
    model: &std::path::Path,
    precision: Precision,
    native_classic: bool,
    n: usize,
) -> (Vec<Vec<f32>>, usize) {
    let (file, tok) = open_model(model, None).unwrap();
    let tokens = tok.encode("The capital of France is Paris, and the capital of", true);
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(
        &mut arenas,
        &file,
        EngineOptions {
            threads: 2,
            precision,
            native_classic,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let requantized = engine.conversions.requantized();
    let out = tokens[..n]
        .iter()
        .enumerate()
        .map(|(pos, &t)| engine.forward(t, pos).to_vec())
        .collect();
    (out, requantized)
}

/// `leanstream requant` writes the values boot's own requantization makes: the requantized SmolLM2
/// boots with nothing requantized and decodes bit for bit as the original at w4a8. Native
/// precision, a non-GGUF input and an output over the input are refused with a sentence, and a
/// refused run leaves no file behind.
#[test]
fn requantized_file_decodes_as_requantized_at_boot() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("leanstream-requant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smollm2.w4a8.gguf");
    let m = model.to_str().unwrap();
    let o = out.to_str().unwrap();
    let (code, err) = leanstream(&["requant", m, "--precision", "w4a8", "--out", o]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("84 Q4_1 -> Q4_0 requantized (round to nearest, group 32)")
            && err.contains("126 Q4_1 -> Q8_0 requantized")
            && err.contains("requantization error (relative RMS)"),
        "report: {err}"
    );

    let (want, requantized) = logits(&model, Precision::W4a8, 6);
    assert_eq!(requantized, 210, "the original is requantized at boot");
    let (got, requantized) = logits(&out, Precision::W4a8, 6);
    assert_eq!(requantized, 0, "the requantized file imports as it is");
    for (pos, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "logits differ at position {pos}"
        );
    }
    // Run as stored (native: its Q4_0/Q8_0 imported as they are into the same integer kernels,
    // f16 KV), it still makes sense: its greedy next token after the prompt matches the w4a8
    // engine's.
    let (native, requantized) = logits(&out, Precision::Native, 6);
    assert_eq!(requantized, 0, "native imports Q4_0/Q8_0 as they are");
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
    };
    assert_eq!(argmax(&native[5]), argmax(&got[5]));
    // The classic kernels (`native_classic`, the CUDA bench's noise floor) hold the same
    // values and add a row's blocks in another order: at the first position that alone is
    // ~1e-6, not the same bits; later positions carry it through int8 rounding steps of
    // attention's history, as far as the int8 KV cache moves w4a8 from native (measured
    // 8.2e-2 at most, against 6.8e-2).
    let (classic, _) = logits_with(&out, Precision::Native, true, 6);
    let rel = |a: &[f32], b: &[f32]| {
        let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (d / n).sqrt()
    };
    let first = rel(&classic[0], &native[0]);
    assert!(first > 0.0 && first < 1e-4, "first position: {first:.2e}");
    for (pos, (c, n)) in classic.iter().zip(&native).enumerate() {
        let e = rel(c, n);
        assert!(
            e < 0.15,
            "classic vs integer kernels at position {pos}: {e:.2e}"
        );
    }
    assert_eq!(argmax(&classic[5]), argmax(&native[5]));

    for (args, needle) in [
        (
            vec!["requant", m, "--precision", "native", "--out", o],
            "requant needs a precision",
        ),
        (
            vec!["requant", o, "--precision", "w8a8", "--out", o],
            "would overwrite the input",
        ),
        (
            vec!["requant", m, "--precision", "w3a8", "--out", o],
            "unknown precision",
        ),
    ] {
        assert_refused(&args, needle);
    }
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00 truncated").unwrap();
    let bad_out = dir.join("never.gguf");
    assert_refused(
        &[
            "requant",
            junk.to_str().unwrap(),
            "--precision",
            "w8a8",
            "--out",
            bad_out.to_str().unwrap(),
        ],
        "requant reads GGUF files",
    );
    assert!(!bad_out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[path = "common/kquant_model.rs"]
mod kquant_model;

/// K-quant layers read their input with one int8 scale per 256 values (`ActScales::SuperBlock`,
/// llama.cpp's Q8_K) where a scale per 32 was the form before (`k-block-scales`, and the form
/// the GPU's kernels compute). Against the same model with float inputs (`f16`: the weights
/// made f16 at load, exact for these blocks' values) the coarser form may lose a little, not
/// more than half again the finer one's error, and stays within the int8 parity gate. The
/// form is really taken (its logits are not the per-32 ones). Random K-quant weights carry a
/// rounding step further than a trained model's, so this is the harder case (on
/// Qwen2.5-1.5B Q4_K_M the perplexity moves by 0.4%, docs/BENCHMARKS.md).
#[test]
fn k_quant_layers_with_a_scale_per_256_lose_little_against_a_scale_per_32() {
    use leanstream::backend::cpu::matvec::KernelSet;
    let file = kquant_model::kquant_model();
    let vocab = file.hyper().unwrap().vocab_size as u32;
    let prompt: Vec<u32> = (0..8u32).map(|i| (1 + i * 7919) % vocab).collect();
    let run = |precision: Precision, superblock_scales: bool| -> Vec<Vec<f32>> {
        let mut arenas = Arenas::from_board().unwrap();
        let opts = EngineOptions {
            context: 256,
            precision,
            kernels: KernelSet {
                superblock_scales,
                ..KernelSet::best()
            },
            ..EngineOptions::default()
        };
        let mut engine = Engine::boot(&mut arenas, &file, opts).unwrap();
        (prompt.iter().enumerate())
            .map(|(pos, &t)| engine.forward(t, pos).to_vec())
            .collect()
    };
    // The GPU parity tests' figure (cuda.rs), worst over the prompt's positions.
    let worst = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        (a.iter().zip(b))
            .map(|(a, b)| leanstream_tools::bench::rel_err(a, b))
            .fold(0f64, f64::max)
    };
    let float_inputs = run(Precision::F16, true);
    let per_256 = run(Precision::Native, true);
    let per_32 = run(Precision::Native, false);
    let (e256, e32, apart) = (
        worst(&per_256, &float_inputs),
        worst(&per_32, &float_inputs),
        worst(&per_256, &per_32),
    );
    eprintln!(
        "k-quant model (synthetic), max logits rel err against float inputs: a scale per 256 \
         {e256:.2e}, per 32 {e32:.2e}; between them {apart:.2e}"
    );
    assert!(
        apart > 0.0,
        "the two input-scale forms gave the same logits: is the form taken?"
    );
    assert!(
        e256 < 5e-2,
        "a scale per 256: rel err {e256:.3e} over the int8 parity gate"
    );
    assert!(
        e256 <= 1.5 * e32,
        "a scale per 256 loses more than half again a scale per 32's error ({e256:.3e} against {e32:.3e})"
    );
}
