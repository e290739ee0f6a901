//! `leanstream bench` runs several configurations in one process and writes JSON, Markdown and
//! a PNG (the speed figures themselves are in docs/BENCHMARKS.md, not asserted here).

mod common;

use std::process::Command;

#[test]
fn bench_writes_json_markdown_and_png_for_every_configuration() {
    let Some(model) = common::shared("data/stories260K/stories260K.bin") else {
        return;
    };
    let tok = model.with_file_name("tok512.bin");
    let dir = std::env::temp_dir().join(format!("leanstream-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, md, png) = (dir.join("b.json"), dir.join("b.md"), dir.join("b.png"));
    let m = model.to_str().unwrap();
    let two = format!("{m},{m}");
    let out = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args([
            "bench",
            "--model",
            &two,
            "--tokenizer",
            tok.to_str().unwrap(),
        ])
        .args(["--prompt-tokens", "8", "--gen-tokens", "8", "--reps", "1"])
        .args([
            "--json",
            json.to_str().unwrap(),
            "--markdown",
            md.to_str().unwrap(),
        ])
        .args(["--png", png.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "one row per configuration: {j}");
    for r in rows {
        assert!(r["decode_tok_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(r["backend"], "cpu");
    }
    let table = std::fs::read_to_string(&md).unwrap();
    assert_eq!(table.matches("| stories260K cpu").count(), 2, "{table}");
    let img = std::fs::read(&png).unwrap();
    assert_eq!(&img[1..4], b"PNG", "a PNG file");
}
