//! The stacked learnable hashing predictor end to end on SmolLM2-135M (skipped visibly when the
//! model or ../shared's WikiText-2 is absent): a short trace, `leanstream train-predictor`, the
//! table loaded as the daemon loads it, its recall against a random read set of the same size,
//! reproducibility, the refusals (another model's table, a damaged file), and
//! `leanstream predictor-report`.

mod common;

use leanstream::model::ModelFile;
use leanstream::predict::hash::{self, HashPredictorTable};
use leanstream::sparsity::ThresholdTable;
use leanstream_tools::offline::oracle;
use leanstream_tools::offline::trace::TraceReader;
use leanstream_tools::offline::train::data::Inputs;
use std::path::{Path, PathBuf};
use std::process::Output;

fn leanstream(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .expect("run leanstream")
}

fn ok(out: Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn refused(out: Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Trains a small predictor (few epochs, one head) on `trace` into `out`.
fn train(model: &Path, trace: &Path, table: &Path, out: &Path, seed: &str) {
    train_with(model, trace, table, out, seed, &[]);
}

fn train_with(model: &Path, trace: &Path, table: &Path, out: &Path, seed: &str, extra: &[&str]) {
    let mut args = vec![
        "train-predictor",
        "--model",
        s(model),
        "--trace",
        s(trace),
        "--thresholds",
        s(table),
        "--sparsity",
        "0.5",
        "--depth",
        "3",
        "--heads",
        "1",
        "--tau",
        "6",
        "--out-heads",
        "8",
        "--out-tau",
        "4",
        "--epochs",
        "2",
        "--batch",
        "32",
        "--seed",
        seed,
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    ok(leanstream(&args), "train-predictor");
}

/// `predictor-report --refine` on SmolLM2: a table trained on the residual after the previous
/// FFN guesses layer n+1 after each of 4 stages of layer n, in both orders. Stage 0 is one
/// input for both orders (the same figures), the last stage the same sum in another order (the
/// same figures within rounding), every figure a share; the refinement does not lose what the
/// one-shot guess had. A table reading another input, or a trace of one stage, is refused.
#[test]
fn smollm2_refine_report_measures_each_stage_in_both_orders() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let Some(text) = common::shared("data/wikitext-2/wiki.test.raw") else {
        return;
    };
    let thresholds = common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
    let dir =
        TmpDir(std::env::temp_dir().join(format!("leanstream-refine-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let trace_of = |name: &str, stages: &str| {
        let trace = dir.0.join(name);
        ok(
            leanstream(&[
                "trace",
                "--model",
                s(&model),
                "--file",
                s(&text),
                "--skip-tokens",
                "30000",
                "--tokens",
                "96",
                "--ctx",
                "48",
                "--stages",
                stages,
                "--sparsity",
                "0.5",
                "--out",
                s(&trace),
            ]),
            "trace",
        );
        trace
    };
    let trace = trace_of("k4.st", "4");
    let (ahead, own) = (dir.0.join("ahead.hashpred"), dir.0.join("own.hashpred"));
    train_with(
        &model,
        &trace,
        &thresholds,
        &ahead,
        "3",
        &["--input", "prev-ffn-output"],
    );
    let report = |table: &Path, trace: &Path| {
        leanstream(&[
            "predictor-report",
            "--model",
            s(&model),
            "--trace",
            s(trace),
            "--predictor",
            s(table),
            "--thresholds",
            s(&thresholds),
            "--out",
            s(&dir.0.join("r.json")),
            "--refine",
            s(&dir.0.join("refine.json")),
        ])
    };
    let out = ok(report(&ahead, &trace), "predictor-report --refine");
    assert!(
        out.contains("refine priority top10_recall by stage"),
        "{out}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("refine.json")).unwrap()).unwrap();
    assert_eq!(r["stages"], 4);
    let mean = |order: &str, m: &str| -> Vec<f64> {
        r["orders"][order][m]["mean"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    for m in ["recall", "top10_recall", "importance"] {
        let (p, i) = (mean("priority", m), mean("index", m));
        assert_eq!(p.len(), 5, "{m}: stages 0..=4");
        assert!(
            p.iter().chain(&i).all(|v| (0.0..=1.0).contains(v)),
            "{m}: {p:?} {i:?}"
        );
        assert_eq!(p[0], i[0], "{m}: stage 0 is one input");
        assert!(
            (p[4] - i[4]).abs() < 0.01,
            "{m}: the whole FFN in either order: {p:?} {i:?}"
        );
        assert!(p[4] > 0.5 && p[4] >= p[0] - 0.02, "{m}: {p:?}");
        let layers = r["orders"]["priority"][m]["layers"].as_array().unwrap();
        assert_eq!(
            layers.len(),
            29,
            "{m}: layers 1..30 guessed from the layer before"
        );
    }

    // Refusals: a table reading the layer's own input; a trace of one stage.
    train(&model, &trace, &thresholds, &own, "3");
    let msg = refused(report(&own, &trace), "a table reading ffn-input");
    assert!(msg.contains("--input prev-ffn-output"), "{msg}");
    let one = trace_of("k1.st", "1");
    let msg = refused(report(&ahead, &one), "a trace of one stage");
    assert!(msg.contains("--stages 2"), "{msg}");
}

/// The mean recall of the oracle sets at `thr` on `reader`'s tokens by `table`'s read sets, and
/// a random read set's of the same size (read / neurons).
fn recall_on(
    table: &HashPredictorTable,
    reader: &TraceReader,
    inputs: &Inputs,
    thr: &[f32],
) -> (f64, f64) {
    let acts = reader.tensor("neuron_act").unwrap();
    let (nl, n) = (reader.layers, reader.hidden);
    let (mut scores, mut count, mut read) = (vec![0u8; n], vec![0u32; 17], vec![0u32; n]);
    let (mut set, mut member) = (Vec::new(), vec![false; n]);
    let (mut recall, mut random, mut count_sets) = (0f64, 0f64, 0usize);
    for l in 0..nl {
        for t in 0..reader.tokens {
            oracle::oracle_set(&acts[(t * nl + l) * n..][..n], thr[l], &mut set);
            if set.is_empty() {
                continue;
            }
            table.scores(l, inputs.row(table.input, t, l), &mut scores);
            let k = hash::top_scores(
                &scores,
                table.layers[l].read as usize,
                &mut count,
                &mut read,
            );
            read[..k].iter().for_each(|&j| member[j as usize] = true);
            let hit = set.iter().filter(|&&j| member[j as usize]).count();
            read[..k].iter().for_each(|&j| member[j as usize] = false);
            recall += hit as f64 / set.len() as f64;
            random += k as f64 / n as f64;
            count_sets += 1;
        }
    }
    (recall / count_sets as f64, random / count_sets as f64)
}

#[test]
fn smollm2_predictor_trains_loads_beats_random_and_refuses_what_is_not_its_own() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let Some(text) = common::shared("data/wikitext-2/wiki.test.raw") else {
        return;
    };
    let thresholds = common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
    let dir =
        TmpDir(std::env::temp_dir().join(format!("leanstream-predictors-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let trace = dir.0.join("train.st");
    ok(
        leanstream(&[
            "trace",
            "--model",
            s(&model),
            "--file",
            s(&text),
            "--skip-tokens",
            "20000",
            "--tokens",
            "128",
            "--ctx",
            "64",
            "--stages",
            "1",
            "--sparsity",
            "0",
            "--out",
            s(&trace),
        ]),
        "trace",
    );
    let (a, b, c) = (
        dir.0.join("a.hashpred"),
        dir.0.join("b.hashpred"),
        dir.0.join("c.hashpred"),
    );
    train(&model, &trace, &thresholds, &a, "7");

    // Loads as the runtime loads it, for this model's identity and shape.
    let file = ModelFile::open(&model).unwrap();
    let id = leanstream::tables::model_identity(&file);
    let h = file.hyper().unwrap();
    let table = HashPredictorTable::read(&a, id, h.n_layers, h.dim, h.hidden_dim).unwrap();
    assert_eq!(table.sparsity, 0.5);

    // Recall of the oracle sets on the training tokens against a random read set of the same
    // size (whose expected recall is read / neurons).
    let reader = TraceReader::open(&trace).unwrap();
    let inputs = Inputs::new(&reader).unwrap();
    let thr = oracle::thresholds(&ThresholdTable::load(&thresholds, &file).unwrap(), 0.5).unwrap();
    let (recall, random) = recall_on(&table, &reader, &inputs, &thr);
    eprintln!("recall {recall:.3} against {random:.3} for a random set of the same size");
    assert!(
        recall >= 0.89,
        "the read counts were set for recall 0.9: {recall}"
    );
    assert!(
        recall > random + 0.1,
        "the predictor's recall {recall} is no better than a random read set's {random}"
    );

    // `--from`: the same nets, read counts set again for a higher target recall on the same
    // tokens, which the table then reaches.
    let r = dir.0.join("r.hashpred");
    ok(
        leanstream(&[
            "train-predictor",
            "--model",
            s(&model),
            "--trace",
            s(&trace),
            "--thresholds",
            s(&thresholds),
            "--from",
            s(&a),
            "--target-recall",
            "0.97",
            "--out",
            s(&r),
        ]),
        "train-predictor --from",
    );
    let more = HashPredictorTable::read(&r, id, h.n_layers, h.dim, h.hidden_dim).unwrap();
    assert_eq!(more.target_recall, 0.97);
    for (l, (x, y)) in table.layers.iter().zip(&more.layers).enumerate() {
        assert!(y.read >= x.read, "layer {l}: {} -> {}", x.read, y.read);
        let mut y = y.clone();
        y.read = x.read;
        assert_eq!(x, &y, "layer {l}: the net changed");
    }
    let (more_recall, _) = recall_on(&more, &reader, &inputs, &thr);
    assert!(
        more_recall >= 0.969 && more_recall > recall,
        "read counts for 0.97: recall {more_recall} (was {recall})"
    );

    // One seed, one table byte for byte; another seed, another table.
    train(&model, &trace, &thresholds, &b, "7");
    train(&model, &trace, &thresholds, &c, "8");
    let bytes = std::fs::read(&a).unwrap();
    assert_eq!(
        bytes,
        std::fs::read(&b).unwrap(),
        "the same seed gave other bytes"
    );
    assert_ne!(
        bytes,
        std::fs::read(&c).unwrap(),
        "another seed gave the same bytes"
    );

    // The report on the trace: hash and stale, per layer and overall.
    let json = dir.0.join("report.json");
    let out = ok(
        leanstream(&[
            "predictor-report",
            "--model",
            s(&model),
            "--trace",
            s(&trace),
            "--predictor",
            s(&a),
            "--thresholds",
            s(&thresholds),
            "--out",
            s(&json),
        ]),
        "predictor-report",
    );
    assert!(out.contains("hash:") && out.contains("stale:"), "{out}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let preds = r["predictors"].as_array().unwrap();
    assert_eq!(preds.len(), 2);
    for p in preds {
        assert_eq!(p["layers"].as_array().unwrap().len(), h.n_layers);
        for k in [
            "recall",
            "top10_recall",
            "redundancy",
            "us_per_layer",
            "model_pct",
        ] {
            let v = p["overall"][k].as_f64().unwrap();
            assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
        }
    }
    let hash_recall = preds[0]["overall"]["recall"].as_f64().unwrap();
    assert!(
        (hash_recall - recall).abs() < 0.02,
        "report {hash_recall}, here {recall}"
    );
    assert_eq!(
        preds[0]["overall"]["bytes"].as_u64().unwrap() as usize,
        table.bytes()
    );

    // A table of another model: refused, naming that model.
    let mut other = table.clone();
    other.model = "Other-1B.Q8_0.gguf".into();
    let foreign = dir.0.join("other.hashpred");
    std::fs::write(&foreign, other.encode(id ^ 0x5a5a)).unwrap();
    let report = |p: &Path| {
        leanstream(&[
            "predictor-report",
            "--model",
            s(&model),
            "--trace",
            s(&trace),
            "--predictor",
            s(p),
            "--thresholds",
            s(&thresholds),
            "--out",
            s(&json),
        ])
    };
    let e = refused(report(&foreign), "another model's table");
    assert!(
        e.contains("another model") && e.contains("Other-1B.Q8_0.gguf"),
        "{e}"
    );

    // A damaged file (one payload byte flipped): refused as damaged.
    let mut bad = bytes.clone();
    let at = bad.len() - 100;
    bad[at] ^= 0x10;
    let damaged = dir.0.join("damaged.hashpred");
    std::fs::write(&damaged, &bad).unwrap();
    let e = refused(report(&damaged), "a damaged table");
    assert!(e.contains("damaged") && e.contains("checksum"), "{e}");
    assert!(HashPredictorTable::read(&damaged, id, h.n_layers, h.dim, h.hidden_dim).is_err());

    // `predictor-latency` times the table without the model: a row naming its model, kind,
    // layers and bytes; the damaged copy is refused the same way.
    let out = ok(
        leanstream(&["predictor-latency", "--predictor", s(&a), "--tokens", "4"]),
        "predictor-latency",
    );
    let row = format!(
        "| {} | SmolLM2-135M-Instruct.Q4_1.gguf | hash | {} | {} |",
        s(&a),
        h.n_layers,
        table.bytes()
    );
    assert!(out.contains(&row), "no row {row} in:\n{out}");
    let e = refused(
        leanstream(&["predictor-latency", "--predictor", s(&damaged)]),
        "predictor-latency of a damaged table",
    );
    assert!(e.contains("checksum"), "{e}");

    // The baselines in the same harness: DejaVu's MLP and a binarized one, trained on the same
    // labels, their read counts set for recall 0.9 on these tokens, beside hash and stale.
    let mut baselines = Vec::new();
    for (kind, rank) in [("dejavu", "16"), ("bnn", "64")] {
        let out = dir.0.join(format!("{kind}.mlppred"));
        ok(
            leanstream(&[
                "train-baseline",
                "--model",
                s(&model),
                "--trace",
                s(&trace),
                "--thresholds",
                s(&thresholds),
                "--kind",
                kind,
                "--rank",
                rank,
                "--epochs",
                "2",
                "--batch",
                "32",
                "--out",
                s(&out),
            ]),
            "train-baseline",
        );
        baselines.push(out);
    }
    let list = format!("{},{}", s(&baselines[0]), s(&baselines[1]));
    let out = ok(
        leanstream(&[
            "predictor-report",
            "--model",
            s(&model),
            "--trace",
            s(&trace),
            "--predictor",
            s(&a),
            "--thresholds",
            s(&thresholds),
            "--baseline",
            &list,
            "--out",
            s(&json),
        ]),
        "predictor-report with baselines",
    );
    assert!(out.contains("dejavu:") && out.contains("bnn:"), "{out}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for p in &r["predictors"].as_array().unwrap()[2..] {
        let recall = p["overall"]["recall"].as_f64().unwrap();
        assert!(
            recall >= 0.89,
            "{}: recall {recall} on its training tokens",
            p["name"]
        );
    }
    // A baseline's table is not a hashing table, and the other way round.
    let e = refused(report(&baselines[0]), "a baseline's table as --predictor");
    assert!(e.contains("'mlppred', expected 'hashpred'"), "{e}");

    // The learned eviction's table trains on the trace's access stream and runs in cache-sim
    // beside the other policies (the simulator itself is tested in `stream::sim`).
    let reuse = dir.0.join("t.reuse");
    ok(
        leanstream(&[
            "train-eviction",
            "--model",
            s(&model),
            "--trace",
            s(&trace),
            "--epochs",
            "1",
            "--max-samples",
            "5000",
            "--out",
            s(&reuse),
        ]),
        "train-eviction",
    );
    let out = ok(
        leanstream(&[
            "cache-sim",
            "--trace",
            s(&trace),
            "--budgets",
            "0.25",
            "--eviction",
            s(&reuse),
        ]),
        "cache-sim --eviction",
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("| 25%"))
        .expect("a 25% row");
    let v: Vec<f64> = row
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert_eq!(v.len(), 5, "lru, lfu, hot, learned, Belady: {row}");
    assert!(
        v[3] >= v[4] && v[3] <= 1.0,
        "learned within [Belady, 1]: {row}"
    );
}
