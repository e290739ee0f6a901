//! Fixed memory: after boot and the first token, decoding allocates nothing on the heap. A
//! counting global allocator watches every thread (the worker pool included) over 256 steps.
//! It runs without the libtest harness (`harness = false`): the harness's own threads allocate
//! (its slow-test reporter, for one), and only the engine's threads may be counted here.

mod common;

use leanstream::engine::generate::{generate, GenerateParams};
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::load::open_model;
use leanstream::sparsity::thresholds::calibrate;
use leanstream::sparsity::trace::TapOptions;
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
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
    let hist = calibrate(&mut engine, &tokens, tokens.len(), &mut |_| {}).unwrap();
    let oracle = FfnOptions {
        mode: FfnMode::Oracle,
        score: Score::Glu,
        sparsity: 0.5,
        thresholds: Some(hist.level(0.5).glu),
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

/// Generates 256 tokens (sampling with temperature, top-k and top-p, and a stop string that
/// never matches) and returns the allocations made after the first token came out.
fn allocations_after_first_token(
    model: &Path,
    tokenizer: Option<&Path>,
    prompt: &str,
    ffn: FfnOptions,
) -> (usize, u64) {
    let (file, tok) = open_model(model, tokenizer).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let mut engine = Engine::boot(
        &mut arenas,
        &file,
        EngineOptions {
            threads: 2,
            context: 0,
            ffn,
            ..Default::default()
        },
    )
    .unwrap();
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
        max_tokens: 256,
        stop: &stops,
        deadline: None,
    };
    let mut generated = 0usize;
    alloc_count::reset();
    let stats = generate(
        &mut engine,
        &mut sampler,
        &tok,
        &ids,
        &params,
        &mut |bytes| {
            generated += bytes.len();
            alloc_count::arm();
            true
        },
    )
    .unwrap();
    // And 256 raw decode steps that ignore end-of-text, so the count covers a full 256.
    alloc_count::arm();
    let mut token = ids[0];
    for pos in 0..256 {
        token = sampler.sample(engine.forward(token, pos));
    }
    alloc_count::disarm();
    eprintln!(
        "{}: {} tokens, {} bytes of text",
        model.display(),
        stats.generated_tokens,
        generated
    );
    (stats.generated_tokens, alloc_count::count())
}

fn main() {
    let mut checked = 0;
    if let (Some(model), Some(tok)) = (
        common::shared("data/stories260K/stories260K.bin"),
        common::shared("data/stories260K/tok512.bin"),
    ) {
        // A story model ends stories with EOS; the count that matters is of steps decoded.
        for ffn in ffn_modes(&model, Some(&tok)) {
            let label = ffn.label();
            let (steps, allocs) =
                allocations_after_first_token(&model, Some(&tok), "Once upon a time", ffn);
            assert!(steps > 20, "only {steps} steps decoded ({label})");
            assert_eq!(
                allocs, 0,
                "{allocs} heap allocations while decoding stories260K ({label})"
            );
            checked += 1;
        }
    }
    if let Some(model) = common::model(common::SMOLLM2) {
        for ffn in ffn_modes(&model, None) {
            let label = ffn.label();
            let (steps, allocs) = allocations_after_first_token(
                &model,
                None,
                "Here is a long list of fruits: apple,",
                ffn,
            );
            assert!(steps > 20, "only {steps} steps decoded ({label})");
            assert_eq!(
                allocs, 0,
                "{allocs} heap allocations while decoding SmolLM2 ({label})"
            );
            checked += 1;
        }
    }
    if checked == 0 {
        eprintln!("skipped: no model available for the allocation test");
    }
    println!("no_alloc_decode: {checked} passed, 0 failed");
}
