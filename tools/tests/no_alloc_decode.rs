//! Fixed memory: after boot, prefill (batched) and decoding allocate nothing on the heap. A
//! counting global allocator watches every thread (the worker pool included) from the prompt
//! through 256 steps.
//! It runs without the libtest harness (`harness = false`): the harness's own threads allocate
//! (its slow-test reporter, for one), and only the engine's threads may be counted here.

mod common;

use leanstream::engine::generate::{generate, GenerateParams};
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::tap::TapOptions;
use leanstream::engine::StreamOptions;
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::kv::{CostModel, Policy};
use leanstream::load::open_model;
use leanstream::predict::hash::PredictorInput;
use leanstream::predict::PredictKind;
use leanstream::quant::{Packing, Precision};
use leanstream::sparsity::ThresholdTable;
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
use leanstream::stream::{CacheBudget, Policy as CachePolicy};
use leanstream_tools::offline::calibrate::calibrate;
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions};
use leanstream_tools::offline::placement::{Active, PlacementKind};
use std::path::Path;

/// The dense FFN, and the sparse modes over bundles: oracle (glu score, thresholds calibrated
/// here on a few tokens of the model's own greedy text) and topk (gate score).
fn ffn_modes(model: &Path, tokenizer: Option<&Path>) -> Vec<FfnOptions> {
    let (file, tok) = open_model(model, tokenizer).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(
        &mut arenas,
        &file,
        EngineOptions {
            threads: 2,
            tap: Some(TapOptions::default()),
            ..Default::default()
        },
    )
    .unwrap();
    let tokens = tok.encode(
        "The sun was warm and the children played by the river all day.",
        true,
    );
    let (_, levels) = calibrate(&mut engine, &tokens, tokens.len(), &[0.5], &mut |_| {}).unwrap();
    let oracle = FfnOptions {
        mode: FfnMode::Oracle,
        score: Score::Glu,
        sparsity: 0.5,
        thresholds: Some(levels[0].glu.clone()),
        dropped: Some(levels[0].glu_dropped.clone()),
        ..Default::default()
    };
    let topk = FfnOptions {
        mode: FfnMode::TopK,
        score: Score::Gate,
        sparsity: 0.8,
        ..Default::default()
    };
    vec![FfnOptions::default(), oracle, topk]
}

use leanstream::serve::alloc_count::{self, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Generates `steps` tokens after the prompt (sampling with temperature, top-k and top-p, and a
/// stop string that never matches), then decodes `steps` more, and returns the allocations made
/// from the prompt on (and the KV segments the engine ended with).
fn allocations_from_prompt(
    model: &Path,
    tokenizer: Option<&Path>,
    prompt: &str,
    opts: EngineOptions,
    steps: usize,
) -> (usize, u64, usize) {
    let (file, tok) = open_model(model, tokenizer).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(&mut arenas, &file, opts).unwrap();
    let idx = engine.take_sample_buffer().unwrap();
    let config = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: 42,
    };
    let mut sampler = Sampler::new(config, idx);
    let ids = tok.encode(prompt, true);
    let stops = ["\u{1F600}never-appears"];
    let params = GenerateParams {
        max_tokens: steps,
        stop: &stops,
        deadline: None,
    };
    let mut generated = 0usize;
    // The prompt is long enough to run as batches (batched prefill) before the first token.
    assert!(ids.len() > 2, "prompt of {} tokens", ids.len());
    alloc_count::reset();
    alloc_count::arm();
    let stats = generate(
        &mut engine,
        &mut sampler,
        &tok,
        &ids,
        &params,
        &mut |bytes| {
            generated += bytes.len();
            true
        },
    )
    .unwrap();
    // And raw decode steps that ignore end-of-text, so the count covers `steps` in full.
    alloc_count::arm();
    let mut token = ids[0];
    for pos in 0..steps {
        token = sampler.sample(engine.forward(token, pos));
    }
    alloc_count::disarm();
    eprintln!(
        "{}: {} tokens, {} bytes of text",
        model.display(),
        stats.generated_tokens,
        generated
    );
    let segments = engine.kv_segments().len();
    (stats.generated_tokens, alloc_count::count(), segments)
}

fn opts(precision: Precision, packing: Packing) -> EngineOptions {
    EngineOptions {
        threads: 2,
        precision,
        packing,
        // Switch KV layouts early, so the segment chain grows during the counted steps.
        kv_policy: Policy::Adaptive(CostModel {
            persist: 4,
            margin: 0.0,
            ..CostModel::default()
        }),
        ..EngineOptions::default()
    }
}

fn main() {
    let mut checked = 0;
    if let (Some(model), Some(tok)) = (
        common::shared("data/stories260K/stories260K.bin"),
        common::shared("data/stories260K/tok512.bin"),
    ) {
        // A story model ends stories with EOS; the count that matters is of steps decoded.
        // The dense FFN, then the sparse modes over bundles.
        for ffn in ffn_modes(&model, Some(&tok)) {
            let label = ffn.label();
            let (steps, allocs, _) = allocations_from_prompt(
                &model,
                Some(&tok),
                "Once upon a time",
                EngineOptions {
                    ffn,
                    ..opts(Precision::Native, Packing::Interleaved)
                },
                256,
            );
            assert!(steps > 20, "only {steps} steps decoded ({label})");
            assert_eq!(
                allocs, 0,
                "{allocs} heap allocations while decoding stories260K ({label})"
            );
            checked += 1;
        }
    }
    if let Some(model) = common::model(common::SMOLLM2) {
        // The model's own types with the f16 KV cache; then w8a8 and w4a8 (integer kernels,
        // the segmented int8 KV cache switching layouts on the way).
        for (precision, packing, steps) in [
            (Precision::Native, Packing::Interleaved, 256),
            (Precision::W8a8, Packing::Interleaved, 128),
            (Precision::W4a8, Packing::Swizzled, 128),
        ] {
            let prompt = "Here is a long list of fruits: apple,";
            let (n, allocs, segments) =
                allocations_from_prompt(&model, None, prompt, opts(precision, packing), steps);
            assert!(n > 20, "only {n} steps decoded");
            assert_eq!(
                allocs, 0,
                "{allocs} heap allocations while decoding SmolLM2 at {precision}"
            );
            if precision != Precision::Native {
                assert!(
                    segments >= 2,
                    "{precision}: the KV chain never grew ({segments})"
                );
            }
            checked += 1;
        }
        // The sparse FFN modes over bundles (the dense FFN ran above).
        for ffn in ffn_modes(&model, None) {
            if ffn.mode == FfnMode::Dense {
                continue;
            }
            let label = ffn.label();
            let (n, allocs, _) = allocations_from_prompt(
                &model,
                None,
                "Here is a long list of fruits: apple,",
                EngineOptions {
                    ffn,
                    ..opts(Precision::Native, Packing::Interleaved)
                },
                256,
            );
            assert!(n > 20, "only {n} steps decoded ({label})");
            assert_eq!(
                allocs, 0,
                "{allocs} heap allocations while decoding SmolLM2 ({label})"
            );
            checked += 1;
        }
    }
    if let Some(model) = common::model(common::SMOLLM2) {
        // The FFN streamed from a flash image: requests, reads, arrivals, evictions and the
        // runs summed as blocks arrive, with both predictors, at a budget that evicts.
        let dir = std::env::temp_dir().join(format!("leanstream-noalloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("smollm2.flash");
        let table = common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
        let o = FlashOptions {
            board: BoardTarget::load("host").unwrap(),
            precision: Precision::Native,
            placement: PlacementKind::Identity,
            thresholds: Some(table.clone()),
            trace: None,
            eval_trace: None,
            active: Active::TopK { keep: 0.2 },
            block_units: 1,
            run_blocks: None,
        };
        write_image(&model, &image, &o, &mut |_, _| {}).unwrap();
        let file = leanstream::model::ModelFile::open(&model).unwrap();
        let t = ThresholdTable::load(&table, &file).unwrap();
        let hash_table = dir.join("smollm2.hashpred");
        std::fs::write(
            &hash_table,
            hash_table_for(&image, PredictorInput::FfnInput),
        )
        .unwrap();
        // Speculate-and-refine: a table reading the residual after the previous FFN, the next
        // layer's reads queued and re-ranked after each of 4 stages.
        let ahead_table = dir.join("smollm2-ahead.hashpred");
        std::fs::write(
            &ahead_table,
            hash_table_for(&image, PredictorInput::PrevFfnOutput),
        )
        .unwrap();
        let reuse_table = dir.join("smollm2.reuse");
        std::fs::write(&reuse_table, reuse_table_for(&image)).unwrap();
        // The controller's LUT: plans that change with the layer and the remaining load.
        let lut = dir.join("smollm2.lut");
        std::fs::write(&lut, lut_for(&image)).unwrap();
        for (predict, policy, refine, controller) in [
            (PredictKind::Oracle, CachePolicy::Lfu, None, false),
            (PredictKind::Stale, CachePolicy::Lru, None, false),
            (PredictKind::Hash, CachePolicy::Lru, None, false),
            (PredictKind::Hash, CachePolicy::Lru, Some(4), false),
            (PredictKind::Stale, CachePolicy::Learned, None, false),
            (PredictKind::Oracle, CachePolicy::Lfu, None, true),
            (PredictKind::Hash, CachePolicy::Lru, Some(4), true),
        ] {
            let ffn = FfnOptions {
                mode: FfnMode::Oracle,
                score: Score::Glu,
                sparsity: 0.5,
                thresholds: Some(t.thresholds(0.5, Score::Glu).unwrap()),
                dropped: Some(t.dropped_mean(0.5, Score::Glu).unwrap()),
                ..Default::default()
            };
            let stream = StreamOptions {
                image: image.clone(),
                budget: CacheBudget::Fraction(0.25),
                policy,
                predict,
                predictor: (predict == PredictKind::Hash).then(|| {
                    if refine.is_some() {
                        ahead_table.clone()
                    } else {
                        hash_table.clone()
                    }
                }),
                eviction: (policy == CachePolicy::Learned).then(|| reuse_table.clone()),
                refine_stages: refine,
                controller: controller.then(|| lut.clone()),
                hot: Vec::new(),
                faults: Vec::new(),
                shuffle: None,
                replay: None,
                merge_blocks: None,
            };
            let (n, allocs, _) = allocations_from_prompt(
                &image,
                None,
                "Here is a long list of fruits: apple,",
                EngineOptions {
                    ffn,
                    stream: Some(stream),
                    context: 160,
                    ..opts(Precision::Native, Packing::Interleaved)
                },
                64,
            );
            assert!(
                n > 20,
                "only {n} steps decoded (streamed, {})",
                predict.name()
            );
            assert_eq!(
                allocs,
                0,
                "{allocs} heap allocations while decoding SmolLM2 streamed ({}, {}, LUT {controller})",
                predict.name(),
                policy.name()
            );
            checked += 1;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if checked == 0 {
        eprintln!("skipped: no model available for the allocation test");
    }
    println!("no_alloc_decode: {checked} passed, 0 failed");
}

/// A controller LUT for `image`: three plans (one lane of depth 1 and one worker; two lanes
/// of 8 with three read-ahead stages; the board's maxima) over four states of remaining load.
fn lut_for(image: &std::path::Path) -> Vec<u8> {
    use leanstream::control::{Lut, StreamPlan};
    let img = leanstream::model::flash::FlashImage::open(image).unwrap();
    let layers = img.layers();
    let plan = |lanes, queue_depth, compute_percent, prefetch| StreamPlan {
        lanes,
        queue_depth,
        compute_percent,
        prefetch,
        freq: None,
    };
    let plans = vec![
        plan(1, 1, 50, 0),
        plan(2, 8, 100, 3),
        StreamPlan::board_default(),
    ];
    let edges = vec![vec![4096, 400_000, 1_200_000]; layers];
    let entries: Vec<Vec<u16>> = (0..layers)
        .map(|l| (0..4).map(|s| ((l + s) % 3) as u16).collect())
        .collect();
    Lut::new(
        leanstream::board::NAME,
        plans,
        &edges,
        &entries,
        layers,
        0.0,
    )
    .unwrap()
    .encode(img.header.tables_identity)
}

/// A hash predictor table for `image` with every layer kind (projection, a middle layer, two
/// voting heads), filled from a fixed generator: its guesses are arbitrary, its work is real.
fn hash_table_for(image: &std::path::Path, input: PredictorInput) -> Vec<u8> {
    use leanstream::predict::hash::{BinaryLayer, HashNet, HashPredictorTable};
    let img = leanstream::model::flash::FlashImage::open(image).unwrap();
    let g = img.geometry(0);
    let (dim, n) = (g.dim as usize, g.neurons as usize);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (heads, tau, oh, ot) = (2usize, 6usize, 2usize, 5usize);
    let cols = heads * tau;
    let layers = (0..img.layers())
        .map(|_| HashNet {
            proj: (0..dim * cols).map(|_| next() as i8).collect(),
            proj_scale: vec![1e-3; cols],
            proj_bias: vec![0.0; cols],
            first_table: (0..heads << tau).map(|_| next()).collect(),
            middle: vec![BinaryLayer {
                w: (0..cols * heads).map(|_| next()).collect(),
                thr: vec![64; cols],
                table: (0..heads << tau).map(|_| next()).collect(),
            }],
            out_w: (0..oh * ot * heads).map(|_| next()).collect(),
            out_thr: vec![64; oh * ot],
            out_table: (0..(oh << ot) * n.div_ceil(64)).map(|_| next()).collect(),
            read: (n / 2) as u32,
        })
        .collect();
    HashPredictorTable {
        model: "SmolLM2 (arbitrary)".into(),
        dim: dim as u32,
        neurons: n as u32,
        input,
        depth: 3,
        heads: heads as u8,
        tau: tau as u8,
        out_heads: oh as u8,
        out_tau: ot as u8,
        sparsity: 0.5,
        target_recall: 0.9,
        seed: 1,
        pca_dims: 1,
        layers,
    }
    .encode(img.header.tables_identity)
}

/// A reuse-distance table for `image` (the `learned` cache policy's), filled from a fixed
/// generator: its predictions are arbitrary, its work (a prediction per access and per
/// evictable block per token, the heap rebuilt) is real.
fn reuse_table_for(image: &std::path::Path) -> Vec<u8> {
    use leanstream::predict::hash::{BinaryLayer, HashNet};
    use leanstream::predict::reuse::{ReuseTable, FEATURES};
    let img = leanstream::model::flash::FlashImage::open(image).unwrap();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (heads, tau, oh, ot, bits) = (2usize, 6usize, 2usize, 5usize, 4usize);
    let cols = heads * tau;
    ReuseTable {
        model: "SmolLM2 (arbitrary)".into(),
        trained_on: "nothing".into(),
        depth: 3,
        heads: heads as u8,
        tau: tau as u8,
        out_heads: oh as u8,
        out_tau: ot as u8,
        code_bits: bits as u8,
        net: HashNet {
            proj: (0..FEATURES * cols).map(|_| next() as i8).collect(),
            proj_scale: vec![1e-2; cols],
            proj_bias: vec![0.0; cols],
            first_table: (0..heads << tau).map(|_| next()).collect(),
            middle: vec![BinaryLayer {
                w: (0..cols * heads).map(|_| next()).collect(),
                thr: vec![64; cols],
                table: (0..heads << tau).map(|_| next()).collect(),
            }],
            out_w: (0..oh * ot * heads).map(|_| next()).collect(),
            out_thr: vec![64; oh * ot],
            out_table: (0..oh << ot).map(|_| next()).collect(),
            read: 1,
        },
        distance: (0..1 << bits).map(|k| k as f32 * 3.0).collect(),
        seed: 1,
    }
    .encode(img.header.tables_identity)
}
