//! Batched prefill (`Engine::feed_many`): the prompt run through the model `PREFILL_BATCH`
//! tokens at a time ends in exactly the state of feeding it token by token. The logits of the
//! token after the prompt, which read every layer's cache at every prompt position, must be
//! bit-identical, and so must the int8 cache's segment chain, at every precision and packing,
//! in the sparse FFN modes, from position 0 and from the middle of a sequence.

mod common;

use leanstream::board::PREFILL_BATCH;
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::kv::{CostModel, Policy};
use leanstream::load::open_model;
use leanstream::quant::{Packing, Precision};
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
use std::path::Path;

/// Feeds `tokens[..n-1]` from `start` one by one, then in batches, and compares the logits of
/// `tokens[n-1]` and the KV segments. Returns how many prompts were compared.
fn batched_equals_sequential(
    model: &Path,
    tokenizer: Option<&Path>,
    opts: EngineOptions,
    text: &str,
) -> usize {
    let (file, tok) = open_model(model, tokenizer).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let label = format!("{} {}", opts.precision, opts.ffn.label());
    let mut engine = Engine::boot(&mut arenas, &file, opts).unwrap();
    let ids = tok.encode(text, true);
    assert!(
        ids.len() > 2 * PREFILL_BATCH + 2,
        "{} tokens: the prompt must span several batches and a partial one",
        ids.len()
    );
    let mut compared = 0;
    // From position 0, and after a prefix fed one by one (a batch starting mid-sequence).
    for start in [0, 5] {
        let last = ids.len() - 1;
        for (p, &t) in ids[..start].iter().enumerate() {
            engine.forward(t, p);
        }
        for (p, &t) in ids[start..last].iter().enumerate() {
            engine.forward(t, start + p);
        }
        let want = engine.forward(ids[last], last).to_vec();
        let want_segments = engine.kv_segments().to_vec();

        // Writing position 0 again overwrites the whole cache.
        for (p, &t) in ids[..start].iter().enumerate() {
            engine.forward(t, p);
        }
        engine.feed_many(&ids[start..last], start);
        let got = engine.forward(ids[last], last).to_vec();
        let differ = want
            .iter()
            .zip(&got)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{label}, start {start}: {differ} of {} logits differ between batched and sequential prefill",
            want.len()
        );
        assert_eq!(
            engine.kv_segments(),
            &want_segments[..],
            "{label}, start {start}: KV segments"
        );
        compared += 1;
    }
    compared
}

fn adaptive(precision: Precision, packing: Packing) -> EngineOptions {
    EngineOptions {
        threads: 2,
        precision,
        packing,
        // Switch KV layouts within the prompt, so a batch spans two segments.
        kv_policy: Policy::Adaptive(CostModel {
            persist: 4,
            margin: 0.0,
            ..CostModel::default()
        }),
        ..EngineOptions::default()
    }
}

const STORY: &str = "Once upon a time there was a little girl named Lily. She loved to play \
    outside in the sun with her dog Max. One day they found a big red ball in the park and \
    played with it until the sky grew dark and their mother called them home for dinner.";

#[test]
fn stories260k_batched_prefill_is_bit_identical() {
    let (Some(model), Some(tok)) = (
        common::shared("data/stories260K/stories260K.bin"),
        common::shared("data/stories260K/tok512.bin"),
    ) else {
        return;
    };
    let n = batched_equals_sequential(
        &model,
        Some(&tok),
        adaptive(Precision::Native, Packing::Interleaved),
        STORY,
    );
    assert_eq!(n, 2);
}

#[test]
fn smollm2_batched_prefill_is_bit_identical_at_every_precision() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let mut n = 0;
    for (precision, packing) in [
        (Precision::Native, Packing::Interleaved),
        (Precision::F16, Packing::Interleaved),
        (Precision::W8a8, Packing::Interleaved),
        (Precision::W4a8, Packing::Contiguous),
        (Precision::W4a8, Packing::Interleaved),
        (Precision::W4a8, Packing::Swizzled),
    ] {
        n += batched_equals_sequential(&model, None, adaptive(precision, packing), STORY);
    }
    // The sparse FFN over neuron bundles runs per token inside each batch.
    let topk = FfnOptions {
        mode: FfnMode::TopK,
        score: Score::Gate,
        sparsity: 0.8,
        ..Default::default()
    };
    n += batched_equals_sequential(
        &model,
        None,
        EngineOptions {
            ffn: topk,
            ..adaptive(Precision::Native, Packing::Interleaved)
        },
        STORY,
    );
    assert_eq!(n, 14);
}
