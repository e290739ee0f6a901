//! Batched prefill (`Engine::prefill`): the prompt run through the model `PREFILL_BATCH` tokens
//! at a time ends in exactly the state of running it token by token. The logits after the
//! prompt's last token, which read every layer's cache at every prompt position, must be
//! bit-identical, and so must the int8 cache's segment chain, at every precision and packing,
//! in the sparse FFN modes, from position 0 and from the middle of a sequence. So must every
//! token's logits from `Engine::score` (perplexity), batched the same way.

mod common;

use leanstream::board::PREFILL_BATCH;
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::kv::{CostModel, Policy};
use leanstream::load::open_model;
use leanstream::quant::{Packing, Precision};
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
use std::path::Path;

/// Runs the prompt from `start` one token at a time, then batched, and compares the logits after
/// its last token and the KV segments. Returns how many prompts were compared.
fn batched_equals_sequential(
    model: &Path,
    tokenizer: Option<&Path>,
    opts: EngineOptions,
    text: &str,
    short: bool,
) -> usize {
    let (file, tok) = open_model(model, tokenizer).unwrap();
    let mut arenas = Arenas::from_board().unwrap();
    let label = format!("{} {}", opts.precision, opts.ffn.label());
    let mut engine = Engine::boot(&mut arenas, &file, opts).unwrap();
    let all = tok.encode(text, true);
    assert!(
        all.len() > 2 * PREFILL_BATCH + 2,
        "{} tokens: the prompt must span several batches and a partial one",
        all.len()
    );
    let mut compared = 0;
    // From position 0, and after a prefix fed one by one (a batch starting mid-sequence); the
    // whole text, or cut to end a batch exactly, to start a new one, or to be one token.
    for (start, len) in cuts(all.len(), short) {
        let ids = &all[..len];
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
        let got = engine.prefill(&ids[start..], start).to_vec();
        let differ = want
            .iter()
            .zip(&got)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{label}, start {start}, {len} tokens: {differ} of {} logits differ between batched and sequential prefill",
            want.len()
        );
        assert_eq!(
            engine.kv_segments(),
            &want_segments[..],
            "{label}, start {start}, {len} tokens: KV segments"
        );

        // Every token's logits (perplexity's `score`) against `forward` one by one.
        let mut want_all = Vec::new();
        for (p, &t) in ids[start..].iter().enumerate() {
            want_all.push(engine.forward(t, start + p).to_vec());
        }
        let mut seen = 0;
        engine.score(&ids[start..], start, &mut |i, logits| {
            let same = logits
                .iter()
                .zip(&want_all[i])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{label}, start {start}, {len} tokens: score's logits of token {i}"
            );
            assert_eq!(i, seen, "tokens scored out of order");
            seen += 1;
        });
        assert_eq!(seen, len - start, "{label}: tokens scored");
        compared += 1;
    }
    compared
}

/// (start, prompt length) pairs: the whole text from 0 and from 5; with `short`, also prompts
/// of one token, of exactly one batch, one batch and a token, and two batches from 5.
fn cuts(n: usize, short: bool) -> Vec<(usize, usize)> {
    let b = PREFILL_BATCH;
    let mut c = vec![(0, n), (5, n)];
    if short {
        c.extend([(0, 1), (0, b), (0, b + 1), (5, 5 + 2 * b), (5, 6)]);
    }
    c
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
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let n = batched_equals_sequential(
        &model,
        Some(&tok),
        adaptive(Precision::Native, Packing::Interleaved),
        STORY,
        true,
    );
    assert_eq!(n, 7);
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
        n += batched_equals_sequential(&model, None, adaptive(precision, packing), STORY, false);
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
        false,
    );
    assert_eq!(n, 14);
}
