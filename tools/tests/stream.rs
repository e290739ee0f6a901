//! The FFN streamed from a flash image through the I/O lanes and the weight cache, on
//! SmolLM2-135M and Qwen2.5-0.5B (skipped visibly when absent): with the oracle's neuron sets
//! the logits are the in-memory sparse FFN's over the same sets, bit for bit, whatever order
//! blocks arrive in and whatever the budget and policy; reads that fail end the token's request
//! with a clear error and the engine goes on serving; a budget below one layer is refused.

mod common;

use common::smol_image::{logits, opts, TmpDir};
use common::tables::{fixed_hash_table, halves_table};

use leanstream::engine::{Arenas, Decoder, Engine, EngineError, StreamOptions};
use leanstream::model::flash::FlashImage;
use leanstream::model::ModelFile;
use leanstream::predict::hash::{HashPredictorTable, PredictorInput};
use leanstream::predict::mlp::{MlpNet, MlpPredictorTable, MlpWeights};
use leanstream::predict::PredictKind;
use leanstream::quant::Precision;
use leanstream::sparsity::{BundleDown, FfnMode, FfnOptions, Score, ThresholdTable};
use leanstream::stream::fault::{Fault, FaultKind};
use leanstream::stream::{CacheBudget, Policy};
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions, BUNDLE_DOWN};
use leanstream_tools::offline::placement::{Active, PlacementKind};
use std::path::{Path, PathBuf};

/// An image of `model` with its committed thresholds table, in `dir`.
fn image(dir: &TmpDir, model: &Path, table: &Path) -> PathBuf {
    image_of(dir, model, table, 1)
}

/// An image of blocks of `units` read units.
fn image_of(dir: &TmpDir, model: &Path, table: &Path, units: usize) -> PathBuf {
    let out = dir.0.join(format!("model-{units}.flash"));
    let o = FlashOptions {
        board: BoardTarget::load("host").unwrap(),
        precision: Precision::Native,
        placement: PlacementKind::Identity,
        thresholds: Some(table.to_path_buf()),
        trace: None,
        eval_trace: None,
        active: Active::TopK { keep: 0.2 },
        block_units: units,
        run_blocks: None,
    };
    write_image(model, &out, &o, &mut |_, _| {}).unwrap();
    out
}

/// The oracle at `sparsity` from the table, with the image's down columns (Q8_0 rows).
fn oracle(table: &ThresholdTable, sparsity: f32) -> FfnOptions {
    FfnOptions {
        mode: FfnMode::Oracle,
        score: Score::Glu,
        sparsity,
        thresholds: Some(table.thresholds(sparsity, Score::Glu).unwrap()),
        bundle_down: BUNDLE_DOWN,
        dropped: Some(table.dropped_mean(sparsity, Score::Glu).unwrap()),
    }
}

/// SmolLM2's image (identity placement, the committed table) in a folder of its own, with its
/// thresholds and the dense part to boot; None (after a `skipped:` line) without the model.
struct Smol {
    _dir: TmpDir,
    path: PathBuf,
    table: ThresholdTable,
    dense: ModelFile,
}

fn smollm2(test: &str) -> Option<Smol> {
    let model = common::model(common::SMOLLM2)?;
    let table_path = common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
    let dir = TmpDir::new(test);
    let path = image(&dir, &model, &table_path);
    let file = ModelFile::open(&model).unwrap();
    let table = ThresholdTable::load(&table_path, &file).unwrap();
    let dense = FlashImage::open(&path).unwrap().dense_model().unwrap();
    Some(Smol {
        _dir: dir,
        path,
        table,
        dense,
    })
}

fn stream(path: &Path, budget: f64, policy: Policy, predict: PredictKind) -> StreamOptions {
    StreamOptions {
        image: path.to_path_buf(),
        budget: CacheBudget::Fraction(budget),
        policy,
        predict,
        predictor: None,
        eviction: None,
        refine_stages: None,
        controller: None,
        hot: Vec::new(),
        faults: Vec::new(),
        shuffle: None,
        replay: None,
        merge_blocks: None,
    }
}

fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    for (t, (x, y)) in a.iter().zip(b).enumerate() {
        let diff = x
            .iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        assert_eq!(diff, 0, "{what}: token {t}: {diff} logits differ");
    }
}

const TOKENS: &[u32] = &[1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 2683, 7, 9];

/// One streamed configuration: budget, policy, pinned hot blocks, arrival order.
type Config = (f64, Policy, usize, Option<u64>);

fn check_bit_for_bit(model_name: &str, table_name: &str, configs: &[Config]) {
    check_bit_for_bit_in(model_name, table_name, 1, configs)
}

fn check_bit_for_bit_in(model_name: &str, table_name: &str, units: usize, configs: &[Config]) {
    let Some(model) = common::model(model_name) else {
        return;
    };
    let table_path = common::repo_root().join("tables").join(table_name);
    let dir = TmpDir::new(&format!("{model_name}-{units}"));
    let path = image_of(&dir, &model, &table_path, units);
    let file = ModelFile::open(&model).unwrap();
    let table = ThresholdTable::load(&table_path, &file).unwrap();
    let h = file.hyper().unwrap();
    let tokens: Vec<u32> = TOKENS.iter().map(|&t| t % h.vocab_size as u32).collect();
    let ffn = oracle(&table, 0.5);
    assert_eq!(ffn.bundle_down, BundleDown::AtLeast8Bit);

    let (want, want_prefill) = {
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = Engine::boot(&mut arenas, &file, opts(ffn.clone(), None)).unwrap();
        let p = e.prefill(&tokens, 0).to_vec();
        (logits(&mut e, &tokens), p)
    };
    let dense = FlashImage::open(&path).unwrap().dense_model().unwrap();
    // Budgets, policies and arrival orders change what is read and when, never the sums.
    for &(budget, policy, hot, shuffle) in configs {
        let mut so = stream(&path, budget, policy, PredictKind::Oracle);
        so.shuffle = shuffle;
        so.hot = (0..hot as u32).map(|b| b * 7).collect();
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
        // The batched prefill path, then token by token.
        let p = e.prefill(&tokens, 0).to_vec();
        same_bits(&[p], std::slice::from_ref(&want_prefill), "prefill");
        let got = logits(&mut e, &tokens);
        same_bits(
            &got,
            &want,
            &format!("{model_name} at {budget} {policy} {shuffle:?}"),
        );
        let st = e.stream().unwrap().stats();
        assert_eq!(
            st.tokens,
            2 * tokens.len() as u64,
            "the prefill and the decode"
        );
        assert_eq!(st.missed, 0, "the oracle reads every block it chose");
        assert!(st.cache.misses > 0 && st.cache.bytes_read > 0, "{st:?}");
        if budget < 1.0 {
            assert!(st.cache.evictions > 0, "a small cache evicts: {st:?}");
        } else {
            assert!(st.cache.hits > 0, "a whole cache hits: {st:?}");
        }
    }
}

#[test]
fn smollm2_streamed_logits_are_the_in_memory_oracles_bit_for_bit() {
    // Real completions arrive several per reap: with LFU the block that just arrived is the
    // least used, which is where a block could be evicted before its run was summed.
    check_bit_for_bit(
        common::SMOLLM2,
        "SmolLM2-135M-Instruct.Q4_1.thresh",
        &[
            (0.25, Policy::Lru, 0, Some(7)),
            (0.25, Policy::Lfu, 0, None),
            (0.5, Policy::Hot, 400, Some(12345)),
            (1.0, Policy::Lru, 0, None),
        ],
    );
}

/// Blocks of two read units (six SmolLM2 bundles each) stream the same sums.
#[test]
fn larger_blocks_stream_the_same_logits() {
    check_bit_for_bit_in(
        common::SMOLLM2,
        "SmolLM2-135M-Instruct.Q4_1.thresh",
        2,
        &[(0.3, Policy::Lfu, 0, None), (0.3, Policy::Lru, 0, Some(3))],
    );
}

#[test]
fn qwen_streamed_logits_are_the_in_memory_oracles_bit_for_bit() {
    check_bit_for_bit(
        common::QWEN05,
        "qwen2.5-coder-0.5b-instruct.thresh",
        &[(0.1, Policy::Lfu, 0, None), (0.5, Policy::Lru, 0, Some(99))],
    );
}

/// The stale predictor reads the previous token's blocks: the first token reads every block
/// of each layer, later ones leave out what was not read (counted), and the text stays
/// sensible enough that the logits are finite.
#[test]
fn stale_reads_last_tokens_blocks_and_counts_what_it_missed() {
    // The folder lives as long as `_dir` (a `..` would drop it here, image and all).
    let Some(Smol {
        _dir,
        path,
        table,
        dense,
    }) = smollm2("stale")
    else {
        return;
    };
    let so = stream(&path, 0.5, Policy::Lru, PredictKind::Stale);
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = Engine::boot(&mut arenas, &dense, opts(oracle(&table, 0.5), Some(so))).unwrap();
    let out = logits(&mut e, &TOKENS[..6]);
    assert!(out.iter().flatten().all(|v| v.is_finite()));
    let st = e.stream().unwrap().stats();
    assert!(st.missed > 0 && st.missed < st.chosen / 2, "{st:?}");
    // A new sequence forgets the last token: its first token reads whole layers again.
    e.begin_sequence();
    let before = e.stream().unwrap().stats().missed;
    e.forward(TOKENS[0], 0);
    assert_eq!(e.stream().unwrap().stats().missed, before);
}

/// Speculate-and-refine (`refine_stages`): with a table reading the residual after the
/// previous FFN, each decode step queues the next layer's reads while a layer runs, re-ranked
/// after each stage of its FFN. It moves reads earlier and changes nothing else: the same
/// logits bit for bit, the same blocks asked for per layer-step, each access counted once; a
/// table voting for every neuron still streams the oracle's logits bit for bit. K > 0 with a
/// table reading another input is refused.
#[test]
fn speculate_and_refine_reads_ahead_and_changes_no_logit() {
    let Some(Smol {
        _dir: dir,
        path,
        table,
        dense,
    }) = smollm2("refine")
    else {
        return;
    };
    let img = FlashImage::open(&path).unwrap();
    let id = img.header.tables_identity;
    let n = img.geometry(0).neurons as usize;
    let ffn = oracle(&table, 0.5);
    let run = |t: &HashPredictorTable, name: &str, k: Option<usize>| {
        let file = dir.0.join(name);
        std::fs::write(&file, t.encode(id)).unwrap();
        let mut so = stream(&path, 0.25, Policy::Lru, PredictKind::Hash);
        so.predictor = Some(file);
        so.refine_stages = k;
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
        assert_eq!(
            e.stream().unwrap().refine_stages(),
            k.unwrap_or(1),
            "default: 1 with such a table"
        );
        e.stream_mut().unwrap().set_recording(true);
        let pre = e.prefill(&TOKENS[..4], 0).to_vec();
        let out = logits(&mut e, &TOKENS[4..10]);
        let rec = e.stream_mut().unwrap().take_recorded();
        (pre, out, e.stream().unwrap().stats(), rec)
    };
    let halves = halves_table(&img);
    let (pre0, off, st0, rec0) = run(&halves, "halves.hashpred", Some(0));
    assert_eq!(st0.ahead, 0, "no look-ahead with K = 0");
    // The guesses do move with the input: both halves are read at some layer-step.
    let half_block = img.block_of(0, n / 2 + 1) as u32;
    assert!(rec0.iter().any(|s| s.iter().any(|&b| b < half_block)));
    assert!(rec0.iter().any(|s| s.iter().any(|&b| b >= half_block)));
    for k in [None, Some(2), Some(8)] {
        let (pre, on, st, rec) = run(&halves, "halves.hashpred", k);
        let what = format!("K = {k:?}");
        same_bits(
            std::slice::from_ref(&pre),
            std::slice::from_ref(&pre0),
            &what,
        );
        same_bits(&on, &off, &what);
        assert_eq!(rec, rec0, "{what}: the blocks asked for");
        assert!(st.ahead > 0, "{what}: {st:?}");
        assert_eq!(
            st.cache.hits + st.cache.misses,
            st0.cache.hits + st0.cache.misses,
            "{what}: each access counted once"
        );
    }

    // Every neuron: the oracle's logits, with the look-ahead's stages.
    let want = {
        let mut arenas = Arenas::from_board().unwrap();
        let so = stream(&path, 0.25, Policy::Lru, PredictKind::Oracle);
        let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
        logits(&mut e, &TOKENS[..6])
    };
    let mut all = fixed_hash_table(&img, &|_| true, n as u32);
    all.input = PredictorInput::PrevFfnOutput;
    let file = dir.0.join("all.hashpred");
    std::fs::write(&file, all.encode(id)).unwrap();
    let mut so = stream(&path, 0.25, Policy::Lru, PredictKind::Hash);
    so.predictor = Some(file);
    so.refine_stages = Some(4);
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
    same_bits(&logits(&mut e, &TOKENS[..6]), &want, "every neuron, K = 4");

    // A table reading the layer's own input cannot guess the next layer: K > 0 is refused.
    let own = dir.0.join("own.hashpred");
    std::fs::write(&own, fixed_hash_table(&img, &|_| true, 9).encode(id)).unwrap();
    let mut so = stream(&path, 0.25, Policy::Lru, PredictKind::Hash);
    so.predictor = Some(own);
    so.refine_stages = Some(2);
    let mut arenas = Arenas::from_board().unwrap();
    let msg = Engine::boot(&mut arenas, &dense, opts(ffn, Some(so)))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("--refine-stages") && msg.contains("prev-ffn-output"),
        "{msg}"
    );
}

/// `--predict hash` reads the blocks of the neurons its table scores highest: a table voting
/// for every neuron streams the oracle's logits bit for bit; one voting for the first third
/// reads only their blocks and counts the chosen neurons it left out; a table of another
/// model, a damaged one, or one without `--predictor` is refused in a sentence.
#[test]
fn hash_predictor_reads_the_blocks_its_table_scores_highest() {
    let Some(Smol {
        _dir: dir,
        path,
        table,
        dense,
    }) = smollm2("hash")
    else {
        return;
    };
    let img = FlashImage::open(&path).unwrap();
    let id = img.header.tables_identity;
    let n = img.geometry(0).neurons as usize;
    let ffn = oracle(&table, 0.5);
    let run = |t: &HashPredictorTable, name: &str| {
        let file = dir.0.join(name);
        std::fs::write(&file, t.encode(id)).unwrap();
        let mut so = stream(&path, 0.5, Policy::Lru, PredictKind::Hash);
        so.predictor = Some(file);
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
        e.stream_mut().unwrap().set_recording(true);
        let out = logits(&mut e, &TOKENS[..6]);
        let rec = e.stream_mut().unwrap().take_recorded();
        (out, e.stream().unwrap().stats(), rec)
    };
    let want = {
        let mut arenas = Arenas::from_board().unwrap();
        let so = stream(&path, 0.5, Policy::Lru, PredictKind::Oracle);
        let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
        logits(&mut e, &TOKENS[..6])
    };
    // Reading every neuron, the runs choose what the oracle chooses (the same kernels on the
    // same rows, the same threshold) and sum it in the same runs: the same logits, bit for bit.
    let (all, st, _) = run(&fixed_hash_table(&img, &|_| true, n as u32), "all.hashpred");
    same_bits(&all, &want, "a table reading every neuron");
    assert!(st.chosen > 0 && st.missed == 0, "{st:?}");

    let third = n / 3;
    let (some, st, rec) = run(
        &fixed_hash_table(&img, &|j| j < third, third as u32),
        "third.hashpred",
    );
    assert!(some.iter().flatten().all(|v| v.is_finite()));
    // Of the first third the runs keep about as many as the oracle would of all (half).
    let (_, all_st, _) = run(
        &fixed_hash_table(&img, &|_| true, n as u32),
        "all2.hashpred",
    );
    assert!(
        st.chosen > 0 && st.chosen < all_st.chosen * 2 / 3,
        "{st:?} {all_st:?}"
    );
    // Every layer-step read the blocks of the first third of the neurons, and only those;
    // but the first position (the attention sink) reads every block of every layer.
    let layers = img.layers();
    assert_eq!(rec.len(), 6 * layers);
    for (i, step) in rec.iter().enumerate() {
        let l = i % layers;
        let base: u32 = (0..l).map(|k| img.blocks(k) as u32).sum();
        let upto = if i < layers { n } else { third };
        let mut want: Vec<u32> = (0..upto)
            .map(|j| base + img.block_of(l, j) as u32)
            .collect();
        want.dedup();
        assert_eq!(step, &want, "layer-step {i}");
    }
    // And computes there what the oracle computes: the first token's logits are its own.
    same_bits(
        &some[..1],
        &want[..1],
        "the first position with a table reading a third",
    );

    // Refusals, each naming the flag and why.
    let refused = |so: StreamOptions, says: &str| {
        let mut arenas = Arenas::from_board().unwrap();
        let msg = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so)))
            .err()
            .unwrap()
            .to_string();
        assert!(msg.contains("--predictor") && msg.contains(says), "{msg}");
    };
    let other = dir.0.join("other.hashpred");
    std::fs::write(&other, fixed_hash_table(&img, &|_| true, 9).encode(id ^ 1)).unwrap();
    let mut so = stream(&path, 0.5, Policy::Lru, PredictKind::Hash);
    so.predictor = Some(other.clone());
    refused(so.clone(), "made for another model");
    let mut bytes = fixed_hash_table(&img, &|_| true, 9).encode(id);
    bytes.truncate(bytes.len() - 3);
    std::fs::write(&other, &bytes).unwrap();
    refused(so, "damaged");
    let mut t = fixed_hash_table(&img, &|_| true, 9);
    t.input = PredictorInput::PrevResidual;
    let res = dir.0.join("residual.hashpred");
    std::fs::write(&res, t.encode(id)).unwrap();
    let mut so = stream(&path, 0.5, Policy::Lru, PredictKind::Hash);
    so.predictor = Some(res);
    refused(so, "train it with --input ffn-input");

    // The baselines' tables run the same way: an MLP whose second layer favours the first
    // third reads exactly their blocks, fresh or stale; a table of the wrong kind is refused.
    let dim = img.geometry(0).dim as usize;
    let mlp = |input| MlpPredictorTable {
        model: "SmolLM2 (fixed set)".into(),
        dim: dim as u32,
        neurons: n as u32,
        rank: 2,
        input,
        binary: false,
        sparsity: 0.5,
        target_recall: 1.0,
        seed: 0,
        layers: vec![
            MlpNet {
                weights: MlpWeights::Real {
                    w1: vec![0.0; dim * 2],
                    b1: vec![1.0, 1.0],
                    w2: (0..n)
                        .flat_map(|j| [(j < third) as u8 as f32, 0.5])
                        .collect(),
                    b2: vec![0.0; n],
                },
                read: third as u32,
            };
            layers
        ],
    };
    for (kind, input) in [
        (PredictKind::Dejavu, PredictorInput::FfnInput),
        (PredictKind::DejavuStale, PredictorInput::PrevFfnInput),
    ] {
        let file = dir.0.join(format!("{}.mlppred", kind.name()));
        std::fs::write(&file, mlp(input).encode(id)).unwrap();
        let mut so = stream(&path, 0.5, Policy::Lru, kind);
        so.predictor = Some(file.clone());
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = Engine::boot(&mut arenas, &dense, opts(ffn.clone(), Some(so))).unwrap();
        e.stream_mut().unwrap().set_recording(true);
        let p = e.prefill(&TOKENS[..4], 0).to_vec();
        assert!(p.iter().all(|v| v.is_finite()));
        let got = logits(&mut e, &TOKENS[..2]);
        assert!(got.iter().flatten().all(|v| v.is_finite()));
        let rec = e.stream_mut().unwrap().take_recorded();
        assert_eq!(rec.len(), 6 * layers, "{}", kind.name());
        for (i, step) in rec.iter().enumerate() {
            // The prefill runs layer by layer over its 4 tokens, then one token at a time
            // (from position 0 again); position 0 (the attention sink) reads every block.
            let (l, first) = if i < 4 * layers {
                (i / 4, i % 4 == 0)
            } else {
                (i % layers, i < 5 * layers)
            };
            let base: u32 = (0..l).map(|k| img.blocks(k) as u32).sum();
            let last = if first {
                img.blocks(l) - 1
            } else {
                img.block_of(l, third - 1)
            };
            assert_eq!(step.first(), Some(&base), "{} layer-step {i}", kind.name());
            assert_eq!(
                step.last(),
                Some(&(base + last as u32)),
                "{} layer-step {i}",
                kind.name()
            );
        }
        let mut so = stream(&path, 0.5, Policy::Lru, PredictKind::Bnn);
        so.predictor = Some(file);
        refused(so, "--predict bnn runs a bnn table");
    }
}

/// EIO on every attempt of a block ends that token's request with an error naming the read;
/// the engine then decodes the next request as if nothing happened. A truncated image does
/// the same, naming the truncation.
#[test]
fn failed_reads_end_the_request_and_the_engine_goes_on() {
    let Some(Smol {
        _dir: dir,
        path,
        table,
        dense,
    }) = smollm2("faults")
    else {
        return;
    };
    let ffn = oracle(&table, 0.5);
    let img = FlashImage::open(&path).unwrap();
    // The stale predictor reads every block of a layer for a sequence's first token, so each
    // of layer 0's blocks fails its first three attempts (the read and both retries) there.
    fn boot<'a>(
        arenas: &'a mut Arenas,
        dense: &ModelFile,
        path: &Path,
        ffn: &FfnOptions,
        faults: Vec<Fault>,
    ) -> Engine<'a> {
        let mut so = stream(path, 1.0, Policy::Lru, PredictKind::Stale);
        so.faults = faults;
        Engine::boot(arenas, dense, opts(ffn.clone(), Some(so))).unwrap()
    }
    let want = {
        let mut arenas = Arenas::from_board().unwrap();
        let mut e = boot(&mut arenas, &dense, &path, &ffn, Vec::new());
        logits(&mut e, &TOKENS[..3])
    };
    let faults = (0..img.blocks(0) as u32)
        .map(|block| Fault {
            block,
            attempts: 3,
            kind: FaultKind::Eio,
        })
        .collect();
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = boot(&mut arenas, &dense, &path, &ffn, faults);
    e.forward(TOKENS[0], 0);
    let err = e.take_error().expect("the failed reads end the request");
    let msg = EngineError::Read(err).to_string();
    assert!(
        msg.starts_with("the FFN stream from the flash image failed: reading block ")
            && msg.contains("after 3 attempts")
            && msg.contains("Input/output error"),
        "{msg}"
    );
    assert!(e.take_error().is_none(), "said once");
    // The next request: the blocks read now, the logits those of an engine that never failed.
    e.begin_sequence();
    let got = logits(&mut e, &TOKENS[..3]);
    same_bits(&got, &want, "after a failed request");

    // Truncated under the engine: the reads past the end fail, naming it.
    let copy = dir.0.join("truncated.flash");
    std::fs::copy(&path, &copy).unwrap();
    let so = stream(&copy, 0.25, Policy::Lru, PredictKind::Oracle);
    let img = FlashImage::open(&copy).unwrap();
    let dense = img.dense_model().unwrap();
    let (last_layer_at, _) = img.block_extent(img.layers() - 1, 0);
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = Engine::boot(&mut arenas, &dense, opts(ffn, Some(so))).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_len(last_layer_at)
        .unwrap();
    e.forward(TOKENS[0], 0);
    let msg = e.take_error().expect("past the end").to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

/// A budget that cannot hold one layer's blocks is refused at boot, naming the flag.
#[test]
fn a_budget_below_one_layer_is_refused() {
    // The folder lives as long as `_dir` (a `..` would drop it here, image and all).
    let Some(Smol {
        _dir,
        path,
        table,
        dense,
    }) = smollm2("small")
    else {
        return;
    };
    let mut arenas = Arenas::from_board().unwrap();
    // With `hot` too: the budget is what is wrong, not the image's missing profile.
    for policy in [Policy::Lru, Policy::Hot] {
        let so = stream(&path, 0.02, policy, PredictKind::Oracle);
        let e = Engine::boot(&mut arenas, &dense, opts(oracle(&table, 0.5), Some(so)))
            .err()
            .unwrap();
        let msg = e.to_string();
        assert!(
            msg.contains("--ffn-budget buys") && msg.contains("a layer needs up to 512"),
            "{policy:?}: {msg}"
        );
    }
}

fn leanstream(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .unwrap()
}

/// The CLI on an image (`--image`): perplexity and greedy text equal the in-memory oracle's
/// with the same neurons; what cannot stream is refused in a sentence.
#[test]
fn cli_on_an_image_matches_the_in_memory_oracle_and_refuses_what_cannot_stream() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let Some(text) = common::shared("data/wikitext-2/wiki.test.raw") else {
        return;
    };
    let table = common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
    let dir = TmpDir::new("cli");
    let path = image(&dir, &model, &table);
    let (m, p, t) = (
        model.to_str().unwrap(),
        path.to_str().unwrap(),
        text.to_str().unwrap(),
    );
    let sparse = ["--ffn", "oracle", "--sparsity", "0.5"];
    let run = |src: &[&str], cmd: &[&str]| {
        let mut args = cmd.to_vec();
        args.extend(src);
        args.extend(sparse);
        let out = leanstream(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let ppl = ["perplexity", "--file", t, "--ctx", "64", "--chunks", "1"];
    let memory = ["--model", m, "--bundle-down", "q8"];
    let streamed = ["--image", p, "--ffn-budget", "20%", "--cache", "lfu"];
    let last = |s: String| s.lines().last().unwrap_or_default().to_string();
    let want = last(run(&memory, &ppl).0);
    assert!(want.starts_with("ppl = "), "{want}");
    assert_eq!(last(run(&streamed, &ppl).0), want);
    let gen = [
        "generate",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "12",
    ];
    let (text_mem, _) = run(&memory, &gen);
    let (text_img, stats) = run(&streamed, &gen);
    assert_eq!(text_img, text_mem);
    assert!(stats.contains("streamed FFN: cache hit ratio"), "{stats}");

    let refused = |args: &[&str], says: &str| {
        let out = leanstream(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    };
    refused(
        &["generate", "--image", p, "--prompt", "x"],
        "a streamed FFN computes only the neurons a token needs",
    );
    refused(
        &[
            "generate",
            "--image",
            p,
            "--prompt",
            "x",
            "--ffn",
            "oracle",
            "--thresholds",
            table.to_str().unwrap(),
        ],
        "carries the thresholds table it was written with",
    );
    refused(
        &[
            "generate",
            "--image",
            p,
            "--prompt",
            "x",
            "--ffn",
            "topk",
            "--ffn-budget",
            "1%",
        ],
        "raise --ffn-budget",
    );
    refused(
        &[
            "generate", "--image", p, "--prompt", "x", "--ffn", "topk", "--cache", "hot",
        ],
        "this flash image has none",
    );
    refused(
        &[
            "generate",
            "--image",
            p,
            "--prompt",
            "x",
            "--ffn",
            "topk",
            "--predict",
            "psychic",
        ],
        "unknown predictor 'psychic'",
    );
    refused(
        &[
            "generate",
            "--image",
            p,
            "--prompt",
            "x",
            "--predict",
            "hash",
        ],
        "--predict hash needs --predictor FILE",
    );
}
