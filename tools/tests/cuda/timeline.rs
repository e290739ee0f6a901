//! The step's timeline (engine/cuda_timeline.rs, `leanstream gpu-timeline`) on the parity
//! models: every launch writes its slot, in order, and tracing changes no token.

use super::parity_models;
use leanstream::engine::cuda::CudaEngine;
use leanstream::engine::cuda_options::CudaOptions;
use leanstream::engine::{Arenas, Decoder};

/// A traced step against the same step untraced, after the same 8-token prompt: the same
/// greedy token; one launch for the embedding first and the output last, an attention launch
/// a layer; each launch's start, waits and end written and in order; and each launch past its
/// wait only after the launch before it ended (the kernels of a step depend on one another).
#[test]
fn timeline_records_every_launch_in_order_and_changes_no_token() {
    let Some(models) = parity_models() else {
        return;
    };
    let prompt = [1u32, 5, 9, 12, 30, 2, 7, 3];
    for (file, name) in models {
        let step = |timeline: bool| {
            let mut arenas = Arenas::from_board().unwrap();
            let opts = CudaOptions {
                context: 64,
                timeline,
                ..CudaOptions::default()
            };
            let mut e = CudaEngine::boot(&mut arenas, &file, opts).expect("boots");
            e.prefill(&prompt, 0);
            let token = e.forward_greedy(4, prompt.len());
            match timeline {
                true => {
                    let (t, next) = e.timeline_step(token, prompt.len() + 1).expect("traced");
                    (next, t)
                }
                false => (e.forward_greedy(token, prompt.len() + 1), Vec::new()),
            }
        };
        let (plain, _) = step(false);
        let (traced, times) = step(true);
        assert_eq!(traced, plain, "{name}: tracing changed the greedy token");
        let layers = file.hyper().unwrap().n_layers;
        assert_eq!(times.first().unwrap().label.kernel, "embed", "{name}");
        assert_eq!(times.last().unwrap().label.kernel, "output", "{name}");
        let attention = times
            .iter()
            .filter(|t| t.label.kernel == "attention")
            .count();
        assert_eq!(attention, layers, "{name}");
        for (i, t) in times.iter().enumerate() {
            assert!(
                t.start <= t.first_waited
                    && t.first_waited <= t.last_waited
                    && t.last_waited <= t.end
                    && t.end < u64::MAX
                    && t.start > 0,
                "{name}: launch {i} {:?}",
                t
            );
            if i > 0 {
                assert!(
                    t.first_waited >= times[i - 1].end,
                    "{name}: launch {i} ({:?}) went past its wait before launch {} ended",
                    t.label,
                    i - 1
                );
            }
        }
        let step_us = (times.last().unwrap().end - times[0].start) as f64 / 1e3;
        eprintln!(
            "timeline {name}: {} launches, step {step_us:.1} us",
            times.len()
        );
    }
}
