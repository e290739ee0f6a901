//! `leanstream gpu-timeline`: where one decode step's time goes on the GPU, inside the CUDA
//! graph as it runs (engine/cuda_timeline.rs). After a prompt of `--prompt-tokens`, a few
//! steps warm the GPU, then `--steps` steps each record every kernel's start, wait and end.
//! Each kernel is charged with how far it moved the step's last end (its end less the latest
//! end before it): those shares add up to the step, first start to last end. Per kernel kind
//! (embed, q/k/v, attention, wo, gate/up, down, output) the table sums them over the layers,
//! with the time from a kernel's inputs being ready (the first block past its wait) to its
//! end; then one middle layer's kernels in order. Medians over the steps.

use super::*;

#[derive(Args)]
pub struct GpuTimelineArgs {
    /// The model file.
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file for llama2.c checkpoints.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Context before the traced steps, in tokens.
    #[arg(long, default_value_t = 1)]
    prompt_tokens: usize,
    /// Steps traced (the median of each figure is reported).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Memory model: unified or discrete (default: the board's).
    #[arg(long)]
    memory: Option<String>,
    /// native (the file's own types), f16, w8a8 or w4a8, as `bench --precision`.
    #[arg(long, default_value = "native", value_parser = Precision::parse)]
    precision: Precision,
    /// CUDA ablations, comma-separated (`leanstream bench --help` lists them): the step traced
    /// with these fast paths off.
    #[arg(long, value_delimiter = ',', value_parser = Ablation::parse)]
    ablate: Vec<Ablation>,
    /// Where to write the Markdown tables (also printed).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[cfg(not(feature = "cuda"))]
pub fn cmd_gpu_timeline(_: GpuTimelineArgs) -> Result<(), String> {
    Err(leanstream::engine::any::NO_CUDA.into())
}

#[cfg(feature = "cuda")]
pub fn cmd_gpu_timeline(a: GpuTimelineArgs) -> Result<(), String> {
    use leanstream::engine::cuda::{CudaEngine, LaunchTimes};
    if let Some(cpu) = a.ablate.iter().find(|x| x.backend() != Backend::Cuda) {
        return Err(format!(
            "--ablate {}: a CPU ablation; gpu-timeline traces the GPU",
            cpu.name()
        ));
    }
    leanstream::engine::any::probe_cuda().map_err(|e| e.to_string())?;
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    let mut opts = CudaOptions {
        precision: a.precision,
        timeline: true,
        ..CudaOptions::default()
    };
    if let Some(m) = &a.memory {
        opts.memory = parse_memory(m)?;
    }
    for ablation in &a.ablate {
        ablation.apply_cuda(&mut opts);
    }
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = CudaEngine::boot(&mut arenas, &file, opts).map_err(|e| e.to_string())?;
    let prompt = super::cmd_bench::bench_prompt(&tok, a.prompt_tokens);
    let n = prompt.len();
    const WARM: usize = 4;
    if n + WARM + a.steps.max(1) > engine.context() {
        return Err(format!(
            "{} prompt tokens and {} steps pass the context of {}",
            n,
            WARM + a.steps,
            engine.context()
        ));
    }
    if n > 1 {
        engine.prefill(&prompt[..n - 1], 0);
    }
    let (mut token, mut pos) = (prompt[n - 1], n - 1);
    for _ in 0..WARM {
        token = engine.forward_greedy(token, pos);
        pos += 1;
    }
    let mut steps: Vec<Vec<LaunchTimes>> = Vec::new();
    for _ in 0..a.steps.max(1) {
        let (t, next) = engine
            .timeline_step(token, pos)
            .map_err(|e| e.to_string())?;
        token = next;
        pos += 1;
        steps.push(t);
    }
    let md = report(&steps, &engine.gpu.name, &a, n);
    print!("{md}");
    if let Some(p) = &a.markdown {
        std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

/// A step's launches as (kind, layer, the share of the step, inputs-ready-to-end, start to
/// end, the wait, the first to the last block past the wait), in us.
#[cfg(feature = "cuda")]
fn shares(
    step: &[leanstream::engine::cuda::LaunchTimes],
) -> Vec<(&'static str, Option<usize>, [f64; 5])> {
    let t0 = step.iter().map(|l| l.start).min().unwrap_or(0);
    let mut last_end = t0;
    step.iter()
        .map(|l| {
            let share = l.end.saturating_sub(last_end) as f64 / 1e3;
            last_end = last_end.max(l.end);
            let busy = l.end.saturating_sub(l.first_waited) as f64 / 1e3;
            let span = l.end.saturating_sub(l.start) as f64 / 1e3;
            let wait = l.first_waited.saturating_sub(l.start) as f64 / 1e3;
            let spread = l.last_waited.saturating_sub(l.first_waited) as f64 / 1e3;
            (
                l.label.kernel,
                l.label.layer,
                [share, busy, span, wait, spread],
            )
        })
        .collect()
}

#[cfg(feature = "cuda")]
fn report(
    steps: &[Vec<leanstream::engine::cuda::LaunchTimes>],
    gpu: &str,
    a: &GpuTimelineArgs,
    context: usize,
) -> String {
    let per_step: Vec<_> = steps.iter().map(|s| shares(s)).collect();
    let total: Vec<f64> = per_step
        .iter()
        .map(|s| s.iter().map(|x| x.2[0]).sum())
        .collect();
    let step_us = median(total);
    let mut kinds: Vec<&'static str> = Vec::new();
    for (k, _, _) in &per_step[0] {
        if !kinds.contains(k) {
            kinds.push(k);
        }
    }
    let mut md = format!(
        "{}, {gpu}, {:?}, after {context} tokens: one decode step {step_us:.1} us (median of {} traced steps)\n\n",
        a.model.display(),
        a.precision,
        steps.len()
    );
    md += "| kernel | launches | share of the step, us | % | inputs ready to end, us (sum) | start to end, us (sum) |\n|---|---|---|---|---|---|\n";
    for k in &kinds {
        let sum = |i: usize| {
            median(
                per_step
                    .iter()
                    .map(|s| s.iter().filter(|x| x.0 == *k).map(|x| x.2[i]).sum())
                    .collect(),
            )
        };
        let launches = per_step[0].iter().filter(|x| x.0 == *k).count();
        let share = sum(0);
        md += &format!(
            "| {k} | {launches} | {share:.1} | {:.1} | {:.1} | {:.1} |\n",
            100.0 * share / step_us,
            sum(1),
            sum(2)
        );
    }
    // One middle layer in order (the figures of layer 1 would carry layer 0's start-up).
    let layers = per_step[0].iter().filter_map(|x| x.1).max().unwrap_or(0);
    let mid = layers / 2;
    md += &format!(
        "\nLayer {mid}'s launches (medians): share of the step, inputs ready to end, start to end, start to inputs ready, first to last block past its wait, us\n\n| kernel | share | ready to end | start to end | start to ready | first to last ready |\n|---|---|---|---|---|---|\n"
    );
    let n = per_step[0].len();
    for i in 0..n {
        let (k, l, _) = per_step[0][i];
        if l != Some(mid) {
            continue;
        }
        let m = |j: usize| median(per_step.iter().map(|s| s[i].2[j]).collect());
        md += &format!(
            "| {k} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            m(0),
            m(1),
            m(2),
            m(3),
            m(4)
        );
    }
    md
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;
    use leanstream::engine::cuda::{LaunchLabel, LaunchTimes};

    #[test]
    fn shares_charge_each_launch_with_how_far_it_moved_the_steps_end() {
        let at = |kernel, start, first_waited, last_waited, end| LaunchTimes {
            label: LaunchLabel::of(kernel, Some(0)),
            start,
            first_waited,
            last_waited,
            end,
        };
        // q/k/v from 1 to 6 us; attention starts inside it and ends at 9.
        let step = [
            at("q/k/v", 1_000, 2_000, 2_500, 6_000),
            at("attention", 5_000, 6_500, 6_600, 9_000),
        ];
        let s = shares(&step);
        // share, inputs ready to end, start to end, start to ready, first to last ready.
        assert_eq!(s[0].2, [5.0, 4.0, 5.0, 1.0, 0.5]);
        assert_eq!(s[1].2, [3.0, 2.5, 4.0, 1.5, 0.1]);
        assert_eq!((s[1].0, s[1].1), ("attention", Some(0)));
        // The shares add up to the step, first start to last end.
        assert_eq!(s.iter().map(|x| x.2[0]).sum::<f64>(), 8.0);
    }
}
