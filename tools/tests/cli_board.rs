//! `leanstream board`: every budget of the board config with its bytes and owner, and with a
//! model, what booting it takes of each engine arena at each precision.

mod common;

use leanstream::boot::ArenaKind;
use std::process::Command;

fn board(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .arg("board")
        .args(args)
        .output()
        .expect("run leanstream board");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_budget_is_listed_with_its_bytes_and_owner() {
    let (ok, out, err) = board(&[]);
    assert!(ok, "{err}");
    assert!(out.contains(leanstream::board::NAME), "{out}");
    for k in ArenaKind::ALL {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("| {} |", k.field())))
            .unwrap_or_else(|| panic!("no row for {}:\n{out}", k.field()));
        assert!(row.contains(&k.board_budget().to_string()), "{row}");
        assert!(row.contains(k.owner()), "{row}");
    }
    // Both prefill chunks: the CPU's and the GPU's.
    let limits = format!(
        "prefill batch {} (GPU {})",
        leanstream::board::PREFILL_BATCH,
        leanstream::board::GPU_PREFILL_BATCH
    );
    assert!(out.contains(&limits), "{limits} in {out}");
}

#[test]
fn a_model_is_planned_at_each_precision() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let (ok, out, err) = board(&["--model", model.to_str().unwrap(), "--context", "512"]);
    assert!(ok, "{err}");
    for p in ["native", "f16", "w8a8", "w4a8"] {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("| {p} |")))
            .unwrap_or_else(|| panic!("no row for {p}:\n{out}"));
        // SmolLM2-135M fits the host board at every precision.
        assert!(row.contains("yes (512 tokens of context)"), "{row}");
    }
    // f16 takes more of the dense arena than the file's own Q4_1/Q8_0 types.
    let dense = |p: &str| -> f64 {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("| {p} |")))
            .unwrap();
        row.split('|')
            .nth(2)
            .unwrap()
            .trim()
            .trim_end_matches(" MiB")
            .parse()
            .unwrap()
    };
    assert!(dense("f16") > dense("native"), "{out}");
    let (ok, _, err) = board(&["--model", "/nonexistent.gguf"]);
    assert!(!ok && err.contains("/nonexistent.gguf"), "{err}");
}
