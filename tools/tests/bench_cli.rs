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

use common::leanstream;

/// `stream-bench --record-sets` writes the blocks every layer-step of a real streamed decode
/// asked for, in the image's geometry, and `gpu-stream-bench` and `gpu-decode-bench` refuse sets
/// recorded over an image of another geometry in one sentence (before they need a GPU).
#[test]
fn stream_bench_records_block_sets_that_name_their_image() {
    use leanstream::model::flash::FlashImage;
    use leanstream_tools::bench::sets::BlockSets;
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("leanstream-sets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("smol.flash");
    let table = common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
    let (m, img) = (model.to_str().unwrap(), image.to_str().unwrap());
    let out = leanstream(&[
        "flash",
        m,
        "--board",
        leanstream::board::NAME,
        "--thresholds",
        table.to_str().unwrap(),
        "--out",
        img,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "The robot rolled to the kiosk and asked for directions. ".repeat(8),
    )
    .unwrap();
    let sets = dir.join("s.sets");
    let out = leanstream(&[
        "stream-bench",
        "--model",
        m,
        "--image",
        img,
        "--file",
        text.to_str().unwrap(),
        "--sparsity",
        "0.5",
        "--budgets",
        "100",
        "--cache",
        "lru",
        "--warm-tokens",
        "1",
        "--tokens",
        "2",
        "--record-sets",
        sets.to_str().unwrap(),
        "--out",
        dir.join("sb").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flash = FlashImage::open(&image).unwrap();
    let s = BlockSets::read(&sets).unwrap();
    s.check_image(&flash).unwrap();
    let layers = flash.layers();
    assert_eq!(s.steps.len(), 3 * layers, "3 tokens of {layers} layers");
    let mut base = 0u32;
    let mut bases = Vec::new();
    for l in 0..layers {
        bases.push(base);
        base += flash.blocks(l) as u32;
    }
    for (i, step) in s.steps.iter().enumerate() {
        let l = i % layers;
        let end = bases[l] + flash.blocks(l) as u32;
        assert!(!step.is_empty(), "step {i} asked for no block");
        assert!(
            step.iter().all(|&b| (bases[l]..end).contains(&b)),
            "step {i} (layer {l}) names blocks of another layer"
        );
    }
    // Sets of another geometry (layer 0's blocks twice as large) are refused by the replay,
    // naming the layer.
    let mut other = s.clone();
    other.layers[0].1 *= 2;
    let (b0, bytes0) = (flash.blocks(0), flash.geometry(0).block_bytes);
    let other_path = dir.join("other.sets");
    other.write(&other_path).unwrap();
    let out = leanstream(&[
        "gpu-stream-bench",
        "--image",
        img,
        "--sets",
        other_path.to_str().unwrap(),
    ]);
    let geometry = format!(
        "layer 0 had {b0} blocks of {} bytes there, {b0} of {bytes0} here",
        2 * bytes0
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&geometry) || err.contains("no CUDA backend"),
        "{err}"
    );
    // And by the whole-step replay, naming the file too (also before it needs a GPU).
    let out = leanstream(&[
        "gpu-decode-bench",
        "--image",
        img,
        "--sets",
        &format!("mine={}", other_path.display()),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        (err.contains(&geometry) && err.contains("other.sets")) || err.contains("no CUDA backend"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpu-decode-bench --replot` redraws a run's table and plot from its JSON with no GPU: the
/// rows come back in the table (a run from before the ablation's schedule column as
/// `prioritized`, one from before merged reads as merge 1), the in-memory row's missing FFN share too, and the PNG is one.
#[test]
fn gpu_decode_bench_replots_a_run_from_its_json() {
    let dir = std::env::temp_dir().join(format!("leanstream-replot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    let row = |sets: &str, cache: &str, budget: f64, tok_s: f64, share: &str| {
        format!(
            r#"{{"memory":"discrete","sets":"{sets}","cache":"{cache}","budget":{budget},"tok_s":{tok_s},"vs_dense":0.01,"mib_read_per_token":60.0,"belady_mib_per_token":40.0,"hit_ratio":0.2,"ffn_share":{share}}}"#
        )
    };
    let rows = [
        row("smol-oracle", "lfu", 20.0, 7.0, "0.99"),
        row("smol-oracle", "lfu", 50.0, 9.5, "0.98"),
        row("dense", "-", 100.0, 1606.0, "null"),
    ];
    std::fs::write(&json, format!("[{}]", rows.join(","))).unwrap();
    let (png, md) = (dir.join("run.png"), dir.join("run.md"));
    let out = leanstream(&[
        "gpu-decode-bench",
        "--image",
        "unused.flash",
        "--sets",
        "unused.sets",
        "--replot",
        json.to_str().unwrap(),
        "--png",
        png.to_str().unwrap(),
        "--markdown",
        md.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(&md).unwrap();
    assert!(
        table.contains("| discrete | smol-oracle | prioritized | 1 | lfu | 50% | 9.50 |"),
        "{table}"
    );
    assert!(
        table.contains("| discrete | dense | - | - | - | 100% | 1606.00 |"),
        "{table}"
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
    let _ = std::fs::remove_dir_all(&dir);
}
