//! Bad input to the CLI is a clear error and a non-zero exit, never a panic: malformed and
//! truncated model files, missing files, bad sampling values, prompts past the context, and a
//! model that does not fit the board's budgets.

mod common;

use leanstream::boot::{ArenaKind, BootError};
use leanstream::engine::{Arenas, Engine, EngineError, EngineOptions};
use leanstream::model::ModelFile;
use std::process::Command;

fn leanstream(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Fails with exit code 1 and an `error:` line containing `needle`, without a panic.
fn assert_refused(args: &[&str], needle: &str) {
    let (code, _out, err) = leanstream(args);
    assert_eq!(code, 1, "args {args:?}: stderr {err}");
    assert!(err.starts_with("error: "), "args {args:?}: stderr {err}");
    assert!(
        err.contains(needle),
        "args {args:?}: expected {needle:?} in {err}"
    );
    assert!(!err.contains("panicked"), "args {args:?}: {err}");
}

fn scratch_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("leanstream-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn missing_file_is_a_clear_error() {
    assert_refused(
        &["inspect", "/nonexistent/model.gguf"],
        "/nonexistent/model.gguf",
    );
    assert_refused(
        &[
            "generate",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "hi",
        ],
        "/nonexistent/model.gguf",
    );
}

#[test]
fn garbage_and_wrong_magic_are_refused() {
    let p = scratch_file("garbage.bin", b"this is not a model at all, just some text");
    assert_refused(&["inspect", p.to_str().unwrap()], "garbage.bin");
    let p = scratch_file("ggux.gguf", b"GGUF\x09\x00\x00\x00rest");
    assert_refused(&["inspect", p.to_str().unwrap()], "version");
}

#[test]
fn truncated_real_models_are_refused() {
    let mut checked = 0;
    if let Some(model) = common::model(common::SMOLLM2) {
        let bytes = std::fs::read(&model).unwrap();
        for cut in [10, 1000, 200_000, bytes.len() / 2, bytes.len() - 1] {
            let p = scratch_file(&format!("smol-{cut}.gguf"), &bytes[..cut]);
            assert_refused(
                &["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"],
                "",
            );
            std::fs::remove_file(p).unwrap();
        }
        checked += 1;
    }
    if let Some(model) = common::shared("data/stories260K/stories260K.bin") {
        let bytes = std::fs::read(&model).unwrap();
        let p = scratch_file("stories-cut.bin", &bytes[..bytes.len() - 100]);
        assert_refused(&["inspect", p.to_str().unwrap()], "stories-cut.bin");
        checked += 1;
    }
    if checked == 0 {
        eprintln!("skipped: no model to truncate");
    }
}

#[test]
fn bad_sampling_values_and_long_prompts_are_refused() {
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
        "Once",
    ];
    assert_refused(
        &[&base[..], &["--temperature", "-1"]].concat(),
        "temperature",
    );
    assert_refused(&[&base[..], &["--top-p", "0"]].concat(), "top_p");
    // stories260K has a context of 512 tokens.
    let long = "word ".repeat(2000);
    assert_refused(
        &[
            "generate",
            "--model",
            m,
            "--tokenizer",
            t,
            "--prompt",
            &long,
        ],
        "context",
    );
    // And a well-formed run still works, from BOS with an empty prompt.
    let (code, out, err) = leanstream(&[
        "generate",
        "--model",
        m,
        "--tokenizer",
        t,
        "--prompt",
        "",
        "--max-tokens",
        "20",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Once upon a time"), "{out}");
    assert!(err.contains("decode:") && err.contains("tok/s"), "{err}");
}

#[test]
fn model_that_does_not_fit_is_refused_with_bytes() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let file = ModelFile::open(&model).unwrap();
    // A board with a 16 MiB dense-weight budget cannot hold SmolLM2's ~30 MB of embeddings.
    let mut arenas = Arenas::with_budget(ArenaKind::DenseWeights, 16 << 20).unwrap();
    match Engine::boot(&mut arenas, &file, EngineOptions::default()) {
        Err(EngineError::Boot(
            e @ BootError::DoesNotFit {
                arena: ArenaKind::DenseWeights,
                needed,
                available,
                ..
            },
        )) => {
            assert_eq!(available, 16 << 20);
            assert!(needed > available);
            let msg = e.to_string();
            assert!(
                msg.contains("budget.dense_weights") && msg.contains(&needed.to_string()),
                "{msg}"
            );
        }
        Err(other) => panic!("wrong refusal: {other}"),
        Ok(_) => panic!("a 16 MiB budget must not hold SmolLM2"),
    }
    // The KV cache is checked too: 1 MiB cannot hold 4096 tokens of 30 layers.
    let mut arenas = Arenas::with_budget(ArenaKind::Kv, 1 << 20).unwrap();
    let err = Engine::boot(&mut arenas, &file, EngineOptions::default())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("budget.kv"), "{err}");
}

/// `gpu-timeline` takes only CUDA ablations: a CPU one is refused by name, before anything
/// opens (so on any machine).
#[test]
fn gpu_timeline_refuses_a_cpu_ablation() {
    if cfg!(not(feature = "cuda")) {
        eprintln!("skipped: built without the cuda feature (gpu-timeline refuses every run)");
        return;
    }
    assert_refused(
        &[
            "gpu-timeline",
            "--model",
            "/nonexistent.gguf",
            "--ablate",
            "no-vnni",
        ],
        "--ablate no-vnni: a CPU ablation",
    );
}

/// `--backend cuda` where there is no GPU or driver: one clear sentence, exit 1, for the CLI
/// and the daemon. (On the GPU machine this case cannot happen; the test says so.)
#[test]
fn cuda_backend_without_a_gpu_is_one_clear_sentence() {
    if leanstream::engine::any::probe_cuda().is_ok() {
        eprintln!("skipped: this machine has a CUDA GPU (the refusal is for machines without)");
        return;
    }
    let Some(model) = common::shared("data/stories260K/stories260K.bin") else {
        return;
    };
    let tok = model.with_file_name("tok512.bin");
    let (m, t) = (model.to_str().unwrap(), tok.to_str().unwrap());
    let base = ["--model", m, "--tokenizer", t, "--backend", "cuda"];
    let mut gen = vec!["generate", "--prompt", "Once"];
    gen.extend(base);
    assert_refused(&gen, "the CUDA backend needs an NVIDIA GPU and its driver");
    let (_, _, err) = leanstream(&gen);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    let bench = ["bench", "--model", m, "--tokenizer", t, "--backend", "cuda"];
    assert_refused(&bench, "the CUDA backend needs an NVIDIA GPU");
    let timeline = ["gpu-timeline", "--model", m, "--tokenizer", t];
    assert_refused(&timeline, "the CUDA backend needs an NVIDIA GPU");
    assert_refused(
        &[
            "generate",
            "--prompt",
            "x",
            "--model",
            m,
            "--tokenizer",
            t,
            "--backend",
            "tpu",
        ],
        "unknown backend 'tpu'",
    );
    let out = Command::new(common::leanstreamd())
        .args([
            "--model",
            m,
            "--tokenizer",
            t,
            "--backend",
            "cuda",
            "--socket",
            "/tmp/ls-nogpu.sock",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the CUDA backend needs an NVIDIA GPU"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A reader that goes away before the report (`inspect M | head -0`) ends `inspect` quietly with
/// success: no panic over the broken pipe.
#[test]
fn inspect_into_a_closed_pipe_ends_quietly() {
    let Some(model) = common::model(common::SMOLLM2)
        .or_else(|| common::shared("data/stories260K/stories260K.bin"))
    else {
        eprintln!("skipped: no model to inspect");
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(["inspect", model.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the model is even parsed: the report's write meets a broken pipe.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}

/// A file that is neither GGUF nor a llama2.c checkpoint says both, not a nonsense header field
/// (issue 24, item 9).
#[test]
fn a_text_file_is_neither_gguf_nor_llama2c() {
    let p = scratch_file(
        "README.md",
        b"# LeanStream\n\nA fixed-memory LLM inference daemon.\n",
    );
    let (code, _, err) = leanstream(&["inspect", p.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("README.md: neither a GGUF file")
            && err.contains("\"# Le\"")
            && err.contains("nor a llama2.c checkpoint"),
        "{err}"
    );
    assert_refused(
        &["generate", "--model", p.to_str().unwrap(), "--prompt", "x"],
        "neither a GGUF file",
    );
}

/// A missing file is named once (issue 24, item 9).
#[test]
fn a_missing_file_is_named_once() {
    for args in [
        &["inspect", "/nonexistent/model.gguf"][..],
        &[
            "generate",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "x",
        ],
    ] {
        let (code, _, err) = leanstream(args);
        assert_eq!(code, 1, "{err}");
        assert_eq!(err.matches("/nonexistent/model.gguf").count(), 1, "{err}");
    }
    let Some(model) = common::shared("data/stories260K/stories260K.bin") else {
        return;
    };
    let (code, _, err) = leanstream(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        "/nonexistent/tok.bin",
        "--prompt",
        "x",
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("/nonexistent/tok.bin").count(), 1, "{err}");
}

/// Oracle mode without a table says every place it looked, beside the model included; a table
/// given with `--ffn dense` is checked, not ignored (issue 24, items 6 and 9).
#[test]
fn thresholds_are_found_or_refused_clearly() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let (m, t) = (model.to_str().unwrap(), tok.to_str().unwrap());
    let run = |extra: &[&str]| {
        let mut a = vec!["generate", "--model", m, "--tokenizer", t, "--prompt", ""];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--max-tokens", "4"]);
        leanstream(&a)
    };
    let (code, _, err) = run(&["--ffn", "oracle"]);
    assert_eq!(code, 1, "{err}");
    let beside = model.with_file_name("stories260K.thresh");
    assert!(
        err.contains("no thresholds table")
            && err.contains("tables/stories260K.thresh")
            && err.contains(beside.to_str().unwrap())
            && err.contains("leanstream calibrate"),
        "{err}"
    );
    // A file that is no table, and a table of another model, with --ffn dense and topk.
    let not_a_table = scratch_file("bogus.thresh", b"not a table");
    for mode in ["dense", "topk"] {
        let (code, _, err) = run(&["--ffn", mode, "--thresholds", not_a_table.to_str().unwrap()]);
        assert_eq!(code, 1, "--ffn {mode}: {err}");
        assert!(err.contains("bogus.thresh"), "{err}");
        let (code, _, err) = run(&["--ffn", mode, "--thresholds", "/nonexistent/t.thresh"]);
        assert_eq!(code, 1, "--ffn {mode}: {err}");
        assert!(
            err.contains("/nonexistent/t.thresh: thresholds table not found"),
            "{err}"
        );
        assert_eq!(err.matches("/nonexistent/t.thresh").count(), 1, "{err}");
    }
    // The daemon checks it the same way, before it serves.
    let out = Command::new(common::leanstreamd())
        .args([
            "--model",
            m,
            "--tokenizer",
            t,
            "--ffn",
            "dense",
            "--thresholds",
        ])
        .arg(&not_a_table)
        .args(["--socket", "/tmp/ls-bad-thresh.sock"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("bogus.thresh"), "{err}");
}

/// What the CLI clamps it says once on stderr; `--max-tokens 0` reports no made-up speed
/// (issue 24, item 9).
#[test]
fn clamped_options_are_said_and_no_speed_is_invented() {
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
        "Once",
    ];
    let (code, _, err) =
        leanstream(&[&base[..], &["--max-tokens", "9999", "--threads", "0"]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        err.matches("--threads 0 runs 1 worker thread").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("--max-tokens 9999 is past the context of 512 tokens")
            && err.contains("at most 510 are generated"),
        "{err}"
    );
    assert!(err.contains("cpu, 1 threads"), "{err}");
    let (code, out, err) = leanstream(&[&base[..], &["--max-tokens", "0"]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "\n");
    assert!(
        err.contains("prefill: 2 tokens, not run") && !err.contains("tok/s"),
        "{err}"
    );
}

/// Every option of every subcommand has help text, and the top-level help names the GPU
/// (issue 24, item 9).
#[test]
fn every_option_has_help_text() {
    let (code, top, _) = leanstream(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        top.contains("NVIDIA GPU") && top.contains("tokenize"),
        "{top}"
    );
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 13, "{commands:?}");
    for c in &commands {
        let (code, help, err) = leanstream(&[c, "--help"]);
        assert_eq!(code, 0, "{c}: {err}");
        // Each option or argument line of clap's help has its text after two spaces; clap's
        // own notes (`[default: 256]`) are no help text.
        let bare: Vec<&str> = help
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                if !(t.starts_with('-') || t.starts_with('<')) {
                    return false;
                }
                let rest = t.split_once("  ").map(|(_, r)| r.trim()).unwrap_or("");
                let text = rest.split(" [").next().unwrap_or("").trim();
                text.is_empty() || text.starts_with('[')
            })
            .collect();
        assert!(
            bare.is_empty(),
            "{c}: options without help: {bare:?}\n{help}"
        );
    }
}

/// `leanstreamd --max-clients` goes through the board's request-buffer budget: slots (and
/// output buffers) the budget cannot hold are refused at boot, naming the budget and the bytes.
#[test]
fn client_slots_past_the_request_budget_are_refused() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let socket = std::env::temp_dir().join(format!("ls-budget-{}.sock", std::process::id()));
    let run = |extra: &[&str]| {
        Command::new(common::leanstreamd())
            .arg("--model")
            .arg(&model)
            .arg("--tokenizer")
            .arg(&tok)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .output()
            .unwrap()
    };
    for extra in [
        &["--max-clients", "10000"][..],
        &["--output-buffer-kib", "16384"][..],
    ] {
        let out = run(extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains("budget.request_buffers") && err.contains("--max-clients"),
            "{extra:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(!socket.exists(), "a refused daemon made no socket");
    }
}
