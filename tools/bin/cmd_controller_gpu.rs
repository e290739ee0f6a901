//! `leanstream controller gpu-profile` and `gpu-compare`: the controller (LeanStream paper
//! 3.2.3) on the GPU's streamed decoder, over recorded block sets replayed on a same-shape
//! image as `gpu-decode-bench` does. A plan caps the I/O lanes and their depth, the persistent
//! kernel's thread blocks (its compute share) and the read-ahead stages (with a replay, which
//! guesses nothing ahead, only the first three matter). The profile is the CPU's format:
//! `leanstream controller solve` turns it into the LUT. Each run boots its own engine (a cold
//! cache, the sets from their first token), then warms, then measures: runs of different plans
//! see the same requests.

use super::*;
use leanstream::control::{LayerSample, Lut, StreamPlan};
use leanstream::engine::StreamStats;
use leanstream_tools::offline::controller::Profile;

/// What the GPU's controller runs decode.
#[derive(Args)]
pub struct GpuSetup {
    /// The flash image (w8a8 or F16 blocks).
    #[arg(long)]
    image: PathBuf,
    /// The block sets replayed (`stream-bench --record-sets`).
    #[arg(long)]
    sets: PathBuf,
    /// The FFN budget in percent of the image's FFN bytes.
    #[arg(long, default_value_t = 20.0)]
    ffn_budget: f64,
    /// Cache policy: lru, lfu, hot (the sets' most used blocks pinned).
    #[arg(long, default_value = "lru")]
    cache: String,
    /// Memory model: discrete or unified.
    #[arg(long, default_value = "discrete")]
    memory: String,
    /// Tokens decoded before each measured run.
    #[arg(long, default_value_t = 8)]
    warm_tokens: usize,
    /// Tokens measured per run.
    #[arg(long, default_value_t = 24)]
    tokens: usize,
    /// Runs of each configuration, interleaved.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
}

#[derive(Args)]
pub struct GpuProfileArgs {
    #[command(flatten)]
    setup: GpuSetup,
    /// Plans, comma-separated LANES:DEPTH:COMPUTE%:PREFETCH (default: `controller profile`'s
    /// grid).
    #[arg(long, value_delimiter = ',')]
    plans: Vec<StreamPlan>,
    /// The profile (JSON).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct GpuCompareArgs {
    #[command(flatten)]
    setup: GpuSetup,
    #[command(flatten)]
    files: super::cmd_controller::Table5Files,
}

/// One run: tok/s, the stream's counts over the measured tokens, the samples (profiling).
type RunResult = (f64, StreamStats, Vec<LayerSample>);

#[cfg(not(feature = "cuda"))]
fn run_plans(
    _: &GpuSetup,
    _: &[Lut],
    _: bool,
    _: &mut dyn FnMut(usize, usize, RunResult),
) -> Result<(u64, usize), String> {
    Err("this build has no CUDA backend (built without the cuda feature)".into())
}

/// Runs each LUT of `luts` `repeats` times, interleaved, handing `(repeat, index, result)` to
/// `each`; the image's model identity and layers.
#[cfg(feature = "cuda")]
fn run_plans(
    s: &GpuSetup,
    luts: &[Lut],
    profiling: bool,
    each: &mut dyn FnMut(usize, usize, RunResult),
) -> Result<(u64, usize), String> {
    use super::cmd_gpu_decode_bench::gpu::{
        decode, err, ffn, hot_blocks, memory_model, stream_options,
    };
    use leanstream::engine::cuda::{CudaEngine, StreamedBoot};
    use leanstream::engine::cuda_options::CudaOptions;
    use leanstream::engine::Arenas;
    use leanstream::model::flash::FlashImage;
    use leanstream::stream::{CacheBudget, Policy};
    use leanstream_tools::bench::sets::BlockSets;
    use std::sync::Arc;

    if s.tokens == 0 || s.repeats == 0 {
        return Err("--tokens and --repeats must be above 0".into());
    }
    let img = FlashImage::open(&s.image).map_err(|e| format!("{}: {e}", s.image.display()))?;
    img.check_board(leanstream::board::NAME)
        .map_err(|e| format!("{}: {e}", s.image.display()))?;
    let dense_part = img.dense_model().map_err(err)?;
    let layers = img.layers();
    let bs = BlockSets::read(&s.sets)?;
    bs.check_image(&img)
        .map_err(|e| format!("{}: {e}", s.sets.display()))?;
    let steps = Arc::new(bs.steps);
    let policy: Policy = s.cache.parse()?;
    if policy == Policy::Learned {
        return Err("--cache: lru, lfu or hot (the learned policy is gpu-decode-bench's)".into());
    }
    let budget = CacheBudget::Fraction(s.ffn_budget / 100.0);
    let hot = if policy == Policy::Hot {
        hot_blocks(&img, &steps, budget)
    } else {
        Vec::new()
    };
    let so = stream_options(&s.image, budget, policy, &steps, hot);
    let f = ffn(layers);
    let cuda = CudaOptions {
        memory: memory_model(&s.memory)?,
        context: s.warm_tokens + s.tokens + 1,
        ..CudaOptions::default()
    };
    for rep in 0..s.repeats {
        for (i, lut) in luts.iter().enumerate() {
            let mut arenas = Arenas::from_board().map_err(err)?;
            let boot = StreamedBoot {
                stream: &so,
                ffn: &f,
            };
            let mut e = CudaEngine::boot_streamed(&mut arenas, &dense_part, cuda, boot)
                .map_err(|e| format!("{} at {}%: {e}", s.image.display(), s.ffn_budget))?;
            e.set_controller(Some(lut.clone())).map_err(err)?;
            e.begin_sequence();
            let tok = decode(&mut e, 1, 0..s.warm_tokens)?;
            e.reset_stream_stats();
            e.set_stream_profiling(profiling);
            let t = Instant::now();
            decode(&mut e, tok, s.warm_tokens..s.warm_tokens + s.tokens)?;
            let secs = t.elapsed().as_secs_f64();
            let samples = e.take_stream_samples();
            let st = e.stream_stats().expect("streamed");
            each(rep, i, (s.tokens as f64 / secs, st, samples));
        }
    }
    Ok((img.header.tables_identity, layers))
}

/// The model identity and layers of `image`, read before anything runs.
fn image_identity(image: &Path) -> Result<(u64, usize), String> {
    let img = leanstream::model::flash::FlashImage::open(image)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    Ok((img.header.tables_identity, img.layers()))
}

pub fn profile(a: GpuProfileArgs) -> Result<(), String> {
    let plans = if a.plans.is_empty() {
        super::cmd_controller::default_grid()
    } else {
        a.plans.clone()
    };
    let board = leanstream::board::NAME;
    let (model_id, layers) = image_identity(&a.setup.image)?;
    let luts = plans
        .iter()
        .map(|p| Lut::single(board, *p, layers).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut prof = Profile {
        board: board.into(),
        model_id,
        layers,
        plans: plans.clone(),
        steps: Vec::new(),
        runs: Vec::new(),
    };
    eprintln!(
        "profiling {} plans x {} repeats on the GPU, {} measured tokens each",
        plans.len(),
        a.setup.repeats,
        a.setup.tokens
    );
    let measured = a.setup.tokens as u64;
    run_plans(&a.setup, &luts, true, &mut |rep, i, (tps, st, samples)| {
        prof.add_run(i as u16, &samples, measured, measured as f64 / tps);
        eprintln!(
            "repeat {rep} plan {i} ({}): {tps:.2} tok/s, {:.0} KiB/token, miss {:.3}",
            plans[i].label(),
            st.bytes_per_token() / 1024.0,
            st.cache.miss_ratio()
        );
    })?;
    super::cmd_controller::write_profile(&prof, &a.out)
}

pub fn compare(a: GpuCompareArgs) -> Result<(), String> {
    let (model_id, layers) = image_identity(&a.setup.image)?;
    let (names, luts): (Vec<String>, Vec<Lut>) =
        a.files.configs(model_id, layers)?.into_iter().unzip();
    let mut table = super::cmd_controller::Table5::new(names);
    run_plans(&a.setup, &luts, false, &mut |rep, i, (t, st, _)| {
        table.add(rep, i, t, a.setup.tokens, &st)
    })?;
    table.write(&a.files, a.setup.repeats)
}
