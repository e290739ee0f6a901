//! Activation sparsity on real models: bundles against the model's own matrices, the modes
//! through the engine, calibration and its table (refusals included), traces, and bad options
//! at the CLI. Small slices only: stories260K, and one short SmolLM2 window.

mod common;

use leanstream::backend::cpu::sparse_ffn::{ffn_subset, partials_len};
use leanstream::backend::cpu::KernelSet;
use leanstream::engine::perplexity::perplexity;
use leanstream::engine::tap::TapOptions;
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::load::open_model;
use leanstream::model::ggml::dequantize_row;
use leanstream::model::ModelFile;
use leanstream::sparsity::thresholds::{ThresholdTable, ThresholdsError};
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
use leanstream::tables::TableError;
use leanstream::tokenizer::Tokenizer;
use leanstream_tools::offline::calibrate::calibrate;
use leanstream_tools::offline::trace::{TraceMeta, TraceReader, TraceWriter};
use std::path::{Path, PathBuf};
use std::process::Command;

fn stories() -> Option<(PathBuf, PathBuf)> {
    Some((
        common::shared("data/stories260K/stories260K.bin")?,
        common::shared("data/stories260K/tok512.bin")?,
    ))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leanstream-sparsity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The f32 KV cache: these tests compare FFN arithmetics, and the f16 cache would round two
/// keys a float-order apart to different halves now and then (stories260K's logits then move
/// by ~1e-3).
fn opts(ffn: FfnOptions) -> EngineOptions {
    EngineOptions {
        threads: 2,
        ffn,
        kv: leanstream::kv::KvChoice::F32,
        ..Default::default()
    }
}

fn sparse(mode: FfnMode, score: Score, sparsity: f32, thresholds: Option<Vec<f32>>) -> FfnOptions {
    FfnOptions {
        mode,
        score,
        sparsity,
        thresholds,
        ..Default::default()
    }
}

/// Calibrates `file` on `tokens` (dense, with a tap) at `sparsities`.
fn calibrated(file: &ModelFile, tokens: &[u32], ctx: usize, sparsities: &[f32]) -> ThresholdTable {
    let mut arenas = Arenas::from_board().unwrap();
    let mut o = opts(FfnOptions::default());
    o.tap = Some(TapOptions::default());
    let mut engine = Engine::boot(&mut arenas, file, o).unwrap();
    let (_, levels) = calibrate(&mut engine, tokens, ctx, sparsities, &mut |_| {}).unwrap();
    ThresholdTable {
        n_layers: engine.hyper.n_layers as u32,
        hidden: engine.hyper.hidden_dim as u32,
        calibration: "test".into(),
        tokens: tokens.len() as u64,
        levels,
    }
}

fn text_tokens(tok: &Tokenizer, skip_bytes: usize, bytes: usize) -> Vec<u32> {
    let wiki = common::shared("data/wikitext-2/wiki.test.raw").unwrap();
    let text = std::fs::read_to_string(wiki).unwrap();
    let start = text[..skip_bytes].rfind('\n').map_or(0, |i| i + 1);
    let end = text[..start + bytes].rfind('\n').unwrap();
    tok.encode(&text[start..=end], false)
}

/// Logits of the first `n` tokens, every position.
fn logits(model: &Path, tok: Option<&Path>, ffn: FfnOptions, tokens: &[u32]) -> Vec<Vec<f32>> {
    let (file, _) = open_model(model, tok).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, opts(ffn)).unwrap();
    tokens
        .iter()
        .enumerate()
        .map(|(p, &t)| engine.forward(t, p).to_vec())
        .collect()
}

/// stories260K is f32: its bundles hold the model's weights exactly, so every neuron through the
/// bundles gives the dense logits; the oracle keeps about 1 - S of the neurons on other text.
#[test]
fn stories260k_modes_against_dense() {
    let Some((model, tok)) = stories() else {
        return;
    };
    if common::shared("data/wikitext-2/wiki.test.raw").is_none() {
        return;
    }
    let (file, t) = open_model(&model, Some(&tok)).unwrap();
    let calib = text_tokens(&t, 200_000, 8000);
    let table = calibrated(&file, &calib[..1024], 256, &[0.5, 0.8]);
    let test: Vec<u32> = text_tokens(&t, 0, 4000)[..200].to_vec();
    // The dropped-neuron means: a neuron is dropped when |activation| is under the layer's glu
    // threshold, so its mean activation while dropped is under it too.
    let hidden = file.hyper().unwrap().hidden_dim;
    for s in [0.5, 0.8] {
        let th = table.thresholds(s, Score::Glu).unwrap();
        let d = table.dropped_mean(s, Score::Glu).unwrap();
        for (l, t) in th.iter().enumerate() {
            let m = &d.mean[l * hidden..][..hidden];
            assert!(m.iter().all(|v| v.abs() <= *t), "layer {l} at {s}");
            assert!(m.iter().any(|v| *v != 0.0), "layer {l} at {s}: no means");
        }
        assert!(d.offset.iter().all(|v| v.is_finite()));
    }
    let dense = logits(&model, Some(&tok), FfnOptions::default(), &test);
    for score in [Score::Glu, Score::Gate] {
        let all = logits(
            &model,
            Some(&tok),
            sparse(FfnMode::TopK, score, 0.0, None),
            &test,
        );
        for (a, b) in all.iter().flatten().zip(dense.iter().flatten()) {
            assert!(
                (a - b).abs() < 1e-3 * (1.0 + b.abs()),
                "{score:?}: {a} vs {b}"
            );
        }
    }
    let mut arenas = Arenas::from_board().unwrap();
    let th = table.thresholds(0.5, Score::Glu).unwrap();
    let mut engine = Engine::boot(
        &mut arenas,
        &file,
        opts(sparse(FfnMode::Oracle, Score::Glu, 0.5, Some(th))),
    )
    .unwrap();
    let dense_ppl = perplexity_of(&model, &tok, &test);
    let with_mean = |s: f32, score: Score| FfnOptions {
        dropped: Some(table.dropped_mean(s, score).unwrap()),
        ..sparse(
            FfnMode::Oracle,
            score,
            s,
            Some(table.thresholds(s, score).unwrap()),
        )
    };
    let configs = [
        with_mean(0.5, Score::Glu),
        with_mean(0.8, Score::Glu),
        with_mean(0.5, Score::Gate),
        sparse(
            FfnMode::Oracle,
            Score::Glu,
            0.5,
            Some(table.thresholds(0.5, Score::Glu).unwrap()),
        ),
    ];
    for o in configs {
        let (s, score) = (o.sparsity, o.score);
        engine.set_ffn(&o).unwrap();
        engine.take_ffn_counts();
        let p = perplexity(&mut engine, &test, 200, 1, &mut |_, _| {})
            .unwrap()
            .ppl;
        let (kept, seen) = engine.take_ffn_counts().unwrap();
        let dropped = 1.0 - kept as f64 / seen as f64;
        eprintln!(
            "stories260K oracle {score:?} {s} (dropped means: {}): dropped {dropped:.3}, ppl {p:.3} (dense {dense_ppl:.3})",
            o.dropped.is_some()
        );
        assert!(
            (dropped - s as f64).abs() < 0.12,
            "dropped {dropped} at {s}"
        );
        assert!(
            p > dense_ppl * 0.9 && p < dense_ppl * 3.0,
            "ppl {p} vs dense {dense_ppl}"
        );
    }
    // topk drops exactly round(S * hidden) per layer and token.
    engine
        .set_ffn(&sparse(FfnMode::TopK, Score::Gate, 0.8, None))
        .unwrap();
    engine.forward(test[0], 0);
    let (kept, seen) = engine.take_ffn_counts().unwrap();
    let hidden = engine.hyper.hidden_dim as f64;
    let want = hidden - (0.8 * hidden).round();
    assert_eq!(kept as f64, want * seen as f64 / hidden);
    // A dense engine cannot switch to a sparse mode (no bundles), and back is refused too.
    assert!(engine.set_ffn(&FfnOptions::default()).is_err());
}

fn perplexity_of(model: &Path, tok: &Path, tokens: &[u32]) -> f64 {
    let (file, _) = open_model(model, Some(tok)).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, opts(FfnOptions::default())).unwrap();
    perplexity(&mut engine, tokens, tokens.len(), 1, &mut |_, _| {})
        .unwrap()
        .ppl
}

/// The bundles of a real Q4_1 model: the FFN over shuffled random subsets of neurons, computed
/// from bundles, against the FFN of the model's own (dequantized) matrices restricted to them.
#[test]
fn smollm2_bundles_equal_dense_restricted() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let file = ModelFile::open(&model).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let engine = Engine::boot(
        &mut arenas,
        &file,
        opts(sparse(FfnMode::TopK, Score::Glu, 0.5, None)),
    )
    .unwrap();
    let (dim, n) = (engine.hyper.dim, engine.hyper.hidden_dim);
    let l = 3;
    let b = *engine.bundles(l).unwrap();
    let deq = |name: &str| {
        let t = file.tensor(&format!("blk.{l}.{name}")).unwrap();
        let rb = t.ty.row_bytes(t.cols).unwrap();
        let mut out = vec![0f32; t.rows * t.cols];
        for (r, o) in out.chunks_exact_mut(t.cols).enumerate() {
            dequantize_row(t.ty, &t.data[r * rb..][..rb], o);
        }
        out
    };
    let (gw, uw, dw) = (
        deq("ffn_gate.weight"),
        deq("ffn_up.weight"),
        deq("ffn_down.weight"),
    );
    let pool = leanstream::backend::cpu::WorkerPool::new(2);
    let mut act = leanstream::backend::cpu::ActScratch::new(n);
    let mut seed = 12345u64;
    let mut rnd = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    let x: Vec<f32> = (0..dim)
        .map(|_| (rnd() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    for trial in 0..4 {
        let keep = [n, n / 2, n / 5, 7][trial];
        let mut set: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            set.swap(i, rnd() % (i + 1));
        }
        set.truncate(keep);
        let mut want = vec![0f64; dim];
        for &j in &set {
            let j = j as usize;
            let dot = |w: &[f32]| -> f64 {
                w[j * dim..][..dim]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum()
            };
            let g = dot(&gw);
            let h = g / (1.0 + (-g).exp()) * dot(&uw);
            for (i, o) in want.iter_mut().enumerate() {
                *o += h * dw[i * n + j] as f64;
            }
        }
        let (mut g, mut h, mut out) = (vec![0f32; n], vec![0f32; n], vec![0f32; dim]);
        let mut partials = vec![0f32; partials_len(n, dim)];
        ffn_subset(
            &b,
            KernelSet::best(),
            &pool,
            &x,
            &set,
            &mut act,
            &mut g,
            &mut h,
            &mut partials,
            &mut out,
        );
        let mut out_rev = vec![0f32; dim];
        set.reverse();
        ffn_subset(
            &b,
            KernelSet::best(),
            &pool,
            &x,
            &set,
            &mut act,
            &mut g,
            &mut h,
            &mut partials,
            &mut out_rev,
        );
        let norm = want.iter().map(|v| v * v).sum::<f64>().sqrt();
        let err = out
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).powi(2))
            .sum::<f64>()
            .sqrt();
        let order = out
            .iter()
            .zip(&out_rev)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{keep} neurons: relative error {:.2e}, order changes by {order:.1e}",
            err / norm
        );
        // The int8 activations (as in the dense kernels) and the Q8_0 down columns: ~1%.
        assert!(
            err / norm < 2e-2,
            "{keep} neurons: relative error {}",
            err / norm
        );
        assert!(
            order as f64 <= 2e-4 * norm.max(1.0),
            "order changed the sum by {order}"
        );
    }
}

/// One short window of SmolLM2: the oracle at 50% stays close to dense, and every neuron
/// through the bundles is dense up to the bundles' down precision.
#[test]
fn smollm2_short_window_quality() {
    let (Some(model), Some(_)) = (
        common::model(common::SMOLLM2),
        common::shared("data/wikitext-2/wiki.test.raw"),
    ) else {
        return;
    };
    let (file, tok) = open_model(&model, None).unwrap();
    let calib = text_tokens(&tok, 400_000, 4000);
    let table = calibrated(&file, &calib[..256], 256, &[0.5]);
    let test = text_tokens(&tok, 0, 4000)[..128].to_vec();
    let ppl = |ffn: FfnOptions| {
        let mut arenas = Arenas::from_board().unwrap();
        let mut engine = Engine::boot(&mut arenas, &file, opts(ffn)).unwrap();
        perplexity(&mut engine, &test, 128, 1, &mut |_, _| {})
            .unwrap()
            .ppl
    };
    let dense = ppl(FfnOptions::default());
    let all = ppl(sparse(FfnMode::TopK, Score::Glu, 0.0, None));
    let half = ppl(sparse(
        FfnMode::Oracle,
        Score::Glu,
        0.5,
        Some(table.thresholds(0.5, Score::Glu).unwrap()),
    ));
    eprintln!("SmolLM2 128 tokens: dense {dense:.4}, all neurons via bundles {all:.4}, oracle-glu-0.5 {half:.4}");
    assert!(
        (all / dense - 1.0).abs() < 0.02,
        "bundles {all} vs dense {dense}"
    );
    assert!(half / dense < 1.10, "oracle 50% {half} vs dense {dense}");
}

/// Tables: saved and loaded for the same model; another model's table, a damaged file and a
/// missing level are clear refusals.
#[test]
fn threshold_tables_refuse_mixups() {
    let Some((model, tok)) = stories() else {
        return;
    };
    if common::shared("data/wikitext-2/wiki.test.raw").is_none() {
        return;
    }
    let (file, t) = open_model(&model, Some(&tok)).unwrap();
    let table = calibrated(&file, &text_tokens(&t, 100_000, 3000)[..256], 128, &[0.5]);
    let path = tmp("stories.thresh");
    table.save(&path, &file).unwrap();
    assert_eq!(ThresholdTable::load(&path, &file).unwrap(), table);
    // The same architecture with one weight changed is another model.
    // (llama2.c: a 28-byte header, then the token embeddings.)
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[28 + 5] ^= 0x55;
    let other = ModelFile::from_bytes(bytes).unwrap();
    let e = ThresholdTable::load(&path, &other).unwrap_err();
    assert!(
        matches!(
            e,
            ThresholdsError::Table {
                source: TableError::OtherModel { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("another model"), "{e}");
    let mut damaged = std::fs::read(&path).unwrap();
    let last = damaged.len() - 3;
    damaged[last] ^= 1;
    let dpath = tmp("damaged.thresh");
    std::fs::write(&dpath, &damaged).unwrap();
    let e = ThresholdTable::load(&dpath, &file).unwrap_err();
    assert!(
        matches!(
            e,
            ThresholdsError::Table {
                source: TableError::Damaged(_),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("damaged"), "{e}");
    let e = table.thresholds(0.3, Score::Glu).unwrap_err();
    assert!(matches!(e, ThresholdsError::NoLevel { .. }), "{e}");
    assert!(e.to_string().contains("calibrate"), "{e}");
}

/// A trace written token by token reads back with the documented shapes, and its stages add up:
/// over the same set, the last stage is the same in priority and in index order.
#[test]
fn trace_round_trip() {
    let Some((model, tok)) = stories() else {
        return;
    };
    if common::shared("data/wikitext-2/wiki.test.raw").is_none() {
        return;
    }
    let (file, t) = open_model(&model, Some(&tok)).unwrap();
    let tokens = text_tokens(&t, 0, 2000)[..48].to_vec();
    let k = 4;
    let mut o = opts(FfnOptions::default());
    o.tap = Some(TapOptions {
        stages: k,
        thresholds: None,
    });
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, o).unwrap();
    let (nl, dim, n) = (
        engine.hyper.n_layers,
        engine.hyper.dim,
        engine.hyper.hidden_dim,
    );
    let path = tmp("trace.safetensors");
    let (mut w, per_token) = TraceWriter::create(
        &path,
        engine.tap().unwrap(),
        tokens.len(),
        &TraceMeta::default(),
    )
    .unwrap();
    assert_eq!(
        per_token as usize,
        8 + 4 * nl * (2 * dim + 2 * k * dim + 2 * n)
    );
    for (i, &tk) in tokens.iter().enumerate() {
        engine.forward(tk, i % 24);
        w.write(i, tk, i % 24, engine.tap().unwrap()).unwrap();
    }
    drop(w);
    let r = TraceReader::open(&path).unwrap();
    assert_eq!(
        (r.tokens, r.layers, r.dim, r.hidden, r.stages),
        (48, nl, dim, n, k)
    );
    assert_eq!(r.position(30).unwrap(), 6);
    assert_eq!(r.tensor("tokens").unwrap()[5].to_bits(), tokens[5]);
    let (p, ix) = (
        r.tensor("stage_residual_priority").unwrap(),
        r.tensor("stage_residual_index").unwrap(),
    );
    assert_eq!(p.len(), 48 * nl * k * dim);
    let (ga, h) = (
        r.tensor("gate_act").unwrap(),
        r.tensor("neuron_act").unwrap(),
    );
    assert!(ga.iter().all(|&v| v >= -0.2785), "SiLU is bounded below");
    assert!(h.iter().any(|&v| v != 0.0));
    for tl in 0..48 * nl {
        let last = |s: &[f32]| s[(tl * k + k - 1) * dim..][..dim].to_vec();
        for (a, b) in last(p).iter().zip(last(ix)) {
            assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
    // The first priority stage moves the residual at least as far as the first index stage,
    // on average (it holds the largest activations).
    let moved = |s: &[f32]| {
        let res = r.tensor("ffn_residual").unwrap();
        (0..48 * nl)
            .map(|tl| {
                (0..dim)
                    .map(|i| (s[tl * k * dim + i] - res[tl * dim + i]).powi(2))
                    .sum::<f32>()
            })
            .sum::<f32>()
    };
    assert!(
        moved(p) > moved(ix),
        "priority stage 1 should carry more of the output"
    );
}

fn cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Bad sparsity options are clear errors, never panics.
#[test]
fn bad_sparsity_options_are_refused() {
    let Some((model, tok)) = stories() else {
        return;
    };
    let (m, t) = (model.to_str().unwrap(), tok.to_str().unwrap());
    let missing = tmp("none.thresh");
    let garbage = tmp("garbage.thresh");
    std::fs::write(&garbage, b"LSTBthresh\0\0garbage").unwrap();
    let base = [
        "generate",
        "--model",
        m,
        "--tokenizer",
        t,
        "--prompt",
        "Once",
        "--max-tokens",
        "2",
    ];
    for (extra, needle) in [
        (vec!["--ffn", "topk", "--sparsity", "1"], "outside [0, 1)"),
        (vec!["--ffn", "topk", "--sparsity=-0.2"], "outside [0, 1)"),
        (vec!["--ffn", "topk", "--sparsity", "half"], "not a number"),
        (vec!["--ffn", "sparse"], "dense, oracle or topk"),
        (vec!["--ffn", "topk", "--score", "relu"], "glu or gate"),
        (
            vec!["--ffn", "oracle", "--thresholds", missing.to_str().unwrap()],
            "not found",
        ),
        (
            vec!["--ffn", "oracle", "--thresholds", garbage.to_str().unwrap()],
            "table",
        ),
        (vec!["--ffn", "topk", "--bundle-down", "q2"], "q8 or model"),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra.iter());
        let (code, err) = cli(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (code, err) = cli(&[
        "calibrate",
        "--model",
        m,
        "--tokenizer",
        t,
        "--file",
        m,
        "--sparsity",
        "0.5,1.2",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("outside [0, 1)"), "{err}");
}
