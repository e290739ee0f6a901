//! The streaming controller on the CPU streamed FFN (SmolLM2-135M; skipped visibly when
//! absent): plans change timing, never numbers (logits with any plan, and with a LUT whose
//! plan changes from layer to layer, are the in-memory oracle's bit for bit); the LUT's plan is
//! applied per layer (the profiler's samples say which plan and how many workers); a damaged
//! LUT, one of another model or one over the board's caps is refused at boot in a sentence; the
//! prefetch depth sets how far a prev-ffn-output predictor reads ahead;
//! and `leanstream controller profile` / `solve` make a LUT that `--controller` reads.

mod common;

use common::smol_image::{logits, opts, same_bits, setup, stream, TOKENS};
use common::tables::fixed_hash_table;
use leanstream::control::{Lut, StreamPlan};
use leanstream::engine::{Arenas, Engine};
use leanstream::model::flash::FlashImage;
use leanstream::predict::PredictKind;
use std::path::Path;

fn plan(lanes: u16, depth: u16, compute: u8, prefetch: u8) -> StreamPlan {
    StreamPlan {
        lanes,
        queue_depth: depth,
        compute_percent: compute,
        prefetch,
        freq: None,
    }
}

/// Three plans, four states whose edges split SmolLM2's remaining loads (0 to ~2 MiB a
/// layer), and entries that change with the layer and the state.
fn mixed_lut(layers: usize) -> Lut {
    let plans = vec![plan(4, 64, 100, 1), plan(1, 1, 50, 0), plan(2, 8, 100, 3)];
    let edges = vec![vec![4096, 400_000, 1_200_000]; layers];
    let entries: Vec<Vec<u16>> = (0..layers)
        .map(|l| (0..4).map(|s| ((l + s) % 3) as u16).collect())
        .collect();
    Lut::new("host", plans, &edges, &entries, layers, 0.0).unwrap()
}

#[test]
fn plans_and_the_lut_change_no_logit_and_the_lut_is_applied_per_layer() {
    let Some(s) = setup("bits") else {
        return;
    };
    let want = {
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = Engine::boot(&mut arenas, &s.file, opts(s.ffn.clone(), None)).unwrap();
        let p = e.prefill(TOKENS, 0).to_vec();
        (p, logits(&mut e, TOKENS))
    };
    let img = FlashImage::open(&s.image).unwrap();
    let layers = img.layers();
    let lut = mixed_lut(layers);
    let lut_path = s.dir.0.join("mixed.lut");
    lut.write(&lut_path, img.header.tables_identity).unwrap();
    let dense = img.dense_model().unwrap();

    // Booted with --controller: the prefill and the decode, bit for bit.
    let mut arenas = Arenas::from_board().unwrap();
    let so = stream(&s.image, Some(lut_path.clone()));
    let mut e = Engine::boot(&mut arenas, &dense, opts(s.ffn.clone(), Some(so))).unwrap();
    assert_eq!(e.stream().unwrap().controller(), Some(&lut));
    let p = e.prefill(TOKENS, 0).to_vec();
    same_bits(
        std::slice::from_ref(&p),
        std::slice::from_ref(&want.0),
        "prefill, LUT",
    );
    let st = e.stream_mut().unwrap();
    st.reset_sequence();
    st.set_profiling(true);
    same_bits(&logits(&mut e, TOKENS), &want.1, "decode, LUT");
    // The plan of each layer-step is the LUT's for its layer and measured remaining load, and
    // the compute share was applied (50% of 2 workers is 1).
    let samples = e.stream_mut().unwrap().take_samples();
    assert_eq!(samples.len(), TOKENS.len() * layers);
    let mut used = [false; 3];
    for x in &samples {
        let (p, pl) = lut.plan(x.layer as usize, x.remaining_bytes);
        assert_eq!(x.plan as usize, p, "{x:?}");
        assert_eq!(x.workers as usize, pl.compute_units(2), "{x:?}");
        used[p] = true;
    }
    assert_eq!(used, [true; 3], "every plan ran at some layer-step");
    assert!(samples.iter().any(|x| x.io_ns > 0 && x.bytes_read > 0));

    // Each plan alone, switched at run time on the same engine.
    for single in [plan(1, 1, 50, 0), plan(2, 4, 100, 2), plan(4, 64, 1, 1)] {
        let st = e.stream_mut().unwrap();
        st.set_controller(Some(Lut::single("host", single, layers).unwrap()))
            .unwrap();
        st.reset_sequence();
        same_bits(&logits(&mut e, TOKENS), &want.1, &single.label());
    }
    // No LUT: the board's maxima again.
    e.stream_mut().unwrap().set_controller(None).unwrap();
    same_bits(&logits(&mut e, TOKENS), &want.1, "no LUT");
}

#[test]
fn a_bad_lut_is_refused_at_boot_in_a_sentence() {
    let Some(s) = setup("refuse") else {
        return;
    };
    let img = FlashImage::open(&s.image).unwrap();
    let id = img.header.tables_identity;
    let dense = img.dense_model().unwrap();
    let boot_err = |lut: &Path| {
        let mut arenas = Arenas::from_board().unwrap();
        let so = stream(&s.image, Some(lut.to_path_buf()));
        match Engine::boot(&mut arenas, &dense, opts(s.ffn.clone(), Some(so))) {
            Ok(_) => panic!("{} was accepted", lut.display()),
            Err(e) => e.to_string(),
        }
    };
    let good = mixed_lut(img.layers()).encode(id);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_vec(), "damaged"),
        ("empty", Vec::new(), "not a LeanStream table"),
        (
            "other-model",
            mixed_lut(img.layers()).encode(id ^ 1),
            "another model",
        ),
        ("other-layers", mixed_lut(3).encode(id), "3 layers"),
        (
            "over-caps",
            Lut::single("host", plan(5, 64, 100, 1), img.layers())
                .unwrap()
                .encode(id),
            "5 I/O lanes",
        ),
        (
            "other-board",
            Lut::single("jetson-agx-orin-64gb", plan(1, 1, 100, 1), img.layers())
                .unwrap()
                .encode(id),
            "made for board 'jetson-agx-orin-64gb'",
        ),
    ];
    for (name, bytes, says) in cases {
        let path = s.dir.0.join(format!("{name}.lut"));
        std::fs::write(&path, bytes).unwrap();
        let msg = boot_err(&path);
        assert!(
            msg.contains("--controller") && msg.contains(says),
            "{name}: {msg}"
        );
    }
    let msg = boot_err(&s.dir.0.join("missing.lut"));
    assert!(msg.contains("missing.lut"), "{msg}");
}

/// A hash table reading the residual after the previous FFN that reads every neuron: the
/// streamed logits are the oracle's, and the layer's look-ahead depth is the plan's prefetch.
fn every_neuron_ahead_table(img: &FlashImage) -> Vec<u8> {
    let n = img.geometry(0).neurons;
    let mut t = fixed_hash_table(img, &|_| true, n);
    t.input = leanstream::predict::hash::PredictorInput::PrevFfnOutput;
    t.encode(img.header.tables_identity)
}

#[test]
fn the_prefetch_depth_sets_the_read_ahead_and_changes_no_logit() {
    let Some(s) = setup("prefetch") else {
        return;
    };
    let img = FlashImage::open(&s.image).unwrap();
    let layers = img.layers();
    let dense = img.dense_model().unwrap();
    let want = {
        let mut arenas = Arenas::from_board().unwrap();
        let so = stream(&s.image, None);
        let mut e = Engine::boot(&mut arenas, &dense, opts(s.ffn.clone(), Some(so))).unwrap();
        logits(&mut e, &TOKENS[..6])
    };
    let table = s.dir.0.join("ahead.hashpred");
    std::fs::write(&table, every_neuron_ahead_table(&img)).unwrap();
    let mut so = stream(&s.image, None);
    so.predict = PredictKind::Hash;
    so.predictor = Some(table);
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = Engine::boot(&mut arenas, &dense, opts(s.ffn.clone(), Some(so))).unwrap();
    let mut ahead = Vec::new();
    for prefetch in [0, 1, 4] {
        let st = e.stream_mut().unwrap();
        let lut = Lut::single("host", plan(2, 8, 100, prefetch), layers).unwrap();
        st.set_controller(Some(lut)).unwrap();
        st.reset_sequence();
        st.reset_stats();
        same_bits(
            &logits(&mut e, &TOKENS[..6]),
            &want,
            &format!("prefetch {prefetch}"),
        );
        ahead.push(e.stream().unwrap().stats().ahead);
    }
    // No look-ahead at 0; reads queued ahead at 1 and 4.
    assert_eq!(ahead[0], 0, "{ahead:?}");
    assert!(ahead[1] > 0 && ahead[2] > 0, "{ahead:?}");
}

fn leanstream(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_profiles_solves_and_generates_with_the_lut() {
    let Some(s) = setup("cli") else {
        return;
    };
    let Some(text) = common::shared("data/wikitext-2/wiki.test.raw") else {
        return;
    };
    let (model, image) = (s.model.to_str().unwrap(), s.image.to_str().unwrap());
    let prof = s.dir.0.join("p.json");
    let lut = s.dir.0.join("p.lut");
    let out = leanstream(&[
        "controller",
        "profile",
        "--model",
        model,
        "--image",
        image,
        "--file",
        text.to_str().unwrap(),
        "--skip-tokens",
        "0",
        "--warm-tokens",
        "2",
        "--tokens",
        "3",
        "--repeats",
        "1",
        "--plans",
        "4:64:100:1,1:2:50:1",
        "--out",
        prof.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = leanstream(&[
        "controller",
        "solve",
        "--profile",
        prof.to_str().unwrap(),
        "--states",
        "3",
        "--out",
        lut.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = FlashImage::open(&s.image).unwrap().header.tables_identity;
    let l = Lut::read(&lut, id).unwrap();
    assert_eq!((l.layers(), l.states(), l.plans().len()), (30, 3, 2));
    let gen = |extra: &[&str]| {
        let mut a = vec![
            "generate",
            "--image",
            image,
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "8",
            "--ffn",
            "oracle",
            "--sparsity",
            "0.5",
            "--ffn-budget",
            "25%",
            "--cache",
            "lfu",
        ];
        a.extend_from_slice(extra);
        let out = leanstream(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(gen(&["--controller", lut.to_str().unwrap()]), gen(&[]));
    // A profile that is not one is refused in a sentence.
    let out = leanstream(&[
        "controller",
        "solve",
        "--profile",
        lut.to_str().unwrap(),
        "--out",
        "/dev/null",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a controller profile"));
    // The GPU's Table 5 reads its profile and LUT before it needs a GPU: the same sentence.
    let out = leanstream(&[
        "controller",
        "gpu-compare",
        "--image",
        image,
        "--sets",
        "/nonexistent.sets",
        "--profile",
        lut.to_str().unwrap(),
        "--lut",
        lut.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a controller profile"));
}
