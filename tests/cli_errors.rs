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
    let (Some(model), Some(tok)) = (
        common::shared("data/stories260K/stories260K.bin"),
        common::shared("data/stories260K/tok512.bin"),
    ) else {
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
    let out = Command::new(env!("CARGO_BIN_EXE_leanstreamd"))
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
