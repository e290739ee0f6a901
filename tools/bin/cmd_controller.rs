//! `leanstream controller`: the streaming controller offline (LeanStream paper 3.2.3).
//! - `profile`: decodes text through the streamed FFN once per plan of a grid (interleaved
//!   repeats) and records per layer-step T^I, T^II, bytes read, workers, R and the next R.
//! - `solve`: the finite-horizon backward recursion (eq. 7) over that profile into the LUT.
//! - `compare`: the paper's Table 5 on this machine: the board's fixed plan, the best static
//!   plan of the profile and the LUT, decoded side by side in one process, repeats interleaved.

use super::*;
use leanstream::control::{Lut, StreamPlan};
use leanstream::engine::StreamOptions;
use leanstream::model::flash::FlashImage;
use leanstream::predict::PredictKind;
use leanstream::sparsity::BundleDown;
use leanstream::stream::{CacheBudget, Policy};
use leanstream_tools::offline::controller::{solve, CostModel, Model, Profile};

#[derive(Subcommand)]
pub enum ControllerCommand {
    /// Profile the streamed FFN per (layer, state, plan) over a grid of plans (JSON).
    Profile(ProfileArgs),
    /// Solve the profile by backward recursion into LUT[layer][state] (postcard table).
    Solve(SolveArgs),
    /// Table 5: the fixed plan, the best static plan and the LUT side by side.
    Compare(CompareArgs),
    /// `profile` on the GPU's streamed decoder, replaying recorded block sets over an image
    /// (the compute share is a share of the persistent kernel's thread blocks).
    GpuProfile(super::cmd_controller_gpu::GpuProfileArgs),
    /// `compare` on the GPU's streamed decoder, replaying recorded block sets.
    GpuCompare(super::cmd_controller_gpu::GpuCompareArgs),
}

/// What decodes: the model, its image, the text and the streaming setup.
#[derive(Args)]
pub struct DecodeSetup {
    /// The GGUF the image was written from (its tokenizer).
    #[arg(long)]
    model: PathBuf,
    /// The flash image (`leanstream flash`, with a thresholds table).
    #[arg(long)]
    image: PathBuf,
    /// The text whose tokens are decoded one by one.
    #[arg(long)]
    file: PathBuf,
    #[arg(long, default_value_t = 8192)]
    skip_tokens: usize,
    /// Tokens decoded before each measured run (the cache refills under the run's plan).
    #[arg(long, default_value_t = 8)]
    warm_tokens: usize,
    /// Tokens measured per run.
    #[arg(long, default_value_t = 24)]
    tokens: usize,
    /// Sparsity of the calibrated thresholds (the image's table).
    #[arg(long, default_value_t = 0.5)]
    sparsity: f32,
    /// The weight cache: a share of the image's FFN, or bytes.
    #[arg(long, default_value = "25%")]
    ffn_budget: String,
    /// Cache policy: lru, lfu, hot.
    #[arg(long, default_value = "lfu")]
    cache: String,
    /// Runs of each configuration, interleaved.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    setup: DecodeSetup,
    /// Plans, comma-separated LANES:DEPTH:COMPUTE%:PREFETCH (default: lanes 1, 2, the board's;
    /// depth 4, 16, the board's; compute 50% and 100%; prefetch 1).
    #[arg(long, value_delimiter = ',')]
    plans: Vec<StreamPlan>,
    /// The profile (JSON).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct SolveArgs {
    #[arg(long)]
    profile: PathBuf,
    /// States per layer (bins of the remaining load volume at its quantiles).
    #[arg(long, default_value_t = 4)]
    states: usize,
    /// Layer-steps the recursion looks ahead (eq. 7's H; default: the model's layers).
    #[arg(long)]
    horizon: Option<usize>,
    /// Seconds a joule of the energy proxy costs (0: latency alone, as the paper).
    #[arg(long, default_value_t = 0.0)]
    energy_weight: f64,
    /// The LUT (a postcard table file).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct CompareArgs {
    #[command(flatten)]
    setup: DecodeSetup,
    #[command(flatten)]
    files: Table5Files,
}

pub fn cmd_controller(c: ControllerCommand) -> Result<(), String> {
    match c {
        ControllerCommand::Profile(a) => profile(a),
        ControllerCommand::Solve(a) => solve_cmd(a),
        ControllerCommand::Compare(a) => compare(a),
        ControllerCommand::GpuProfile(a) => super::cmd_controller_gpu::profile(a),
        ControllerCommand::GpuCompare(a) => super::cmd_controller_gpu::compare(a),
    }
}

/// The streamed engine over the setup's image, booted once for every run.
struct Rig {
    tokens: Vec<u32>,
    warm: usize,
    image: FlashImage,
    threads: usize,
    so: StreamOptions,
    ffn: FfnOptions,
}

impl Rig {
    fn new(s: &DecodeSetup) -> Result<Rig, String> {
        let (file, tok) = open_model(&s.model, None)?;
        let h = file.hyper().map_err(|e| e.to_string())?;
        let text =
            std::fs::read_to_string(&s.file).map_err(|e| format!("{}: {e}", s.file.display()))?;
        let all = tok.encode(&text, false);
        let need = s.skip_tokens + s.warm_tokens + s.tokens;
        if all.len() < need || s.tokens == 0 || s.repeats == 0 {
            return Err(format!(
                "{}: {} tokens, {need} needed (skip + warm + measured, measured and repeats > 0)",
                s.file.display(),
                all.len()
            ));
        }
        let image =
            FlashImage::open(&s.image).map_err(|e| format!("{}: {e}", s.image.display()))?;
        let table = ThresholdTable::from_image(&image, &h)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{}: the image has no thresholds table", s.image.display()))?;
        let ffn = FfnOptions {
            mode: FfnMode::Oracle,
            score: Score::Glu,
            sparsity: s.sparsity,
            thresholds: Some(
                table
                    .thresholds(s.sparsity, Score::Glu)
                    .map_err(|e| e.to_string())?,
            ),
            bundle_down: BundleDown::AtLeast8Bit,
            dropped: Some(
                table
                    .dropped_mean(s.sparsity, Score::Glu)
                    .map_err(|e| e.to_string())?,
            ),
        };
        let so = StreamOptions {
            image: s.image.clone(),
            budget: s.ffn_budget.parse::<CacheBudget>()?,
            policy: s.cache.parse::<Policy>()?,
            predict: PredictKind::Oracle,
            predictor: None,
            eviction: None,
            refine_stages: None,
            controller: None,
            hot: Vec::new(),
            faults: Vec::new(),
            shuffle: None,
            replay: None,
            merge_blocks: None,
        };
        Ok(Rig {
            tokens: all[s.skip_tokens..need].to_vec(),
            warm: s.warm_tokens,
            image,
            threads: s
                .threads
                .map(threads_at_least_one)
                .unwrap_or(leanstream::board::CPU_THREADS),
            so,
            ffn,
        })
    }

    /// Boots the engine and calls `f` with it.
    fn with_engine<T>(
        &self,
        f: impl FnOnce(&mut Engine) -> Result<T, String>,
    ) -> Result<T, String> {
        let dense = self.image.dense_model().map_err(|e| e.to_string())?;
        let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
        let o = EngineOptions {
            threads: self.threads,
            context: self.tokens.len() + 1,
            ffn: self.ffn.clone(),
            stream: Some(self.so.clone()),
            ..EngineOptions::default()
        };
        let mut e = Engine::boot(&mut arenas, &dense, o).map_err(|e| e.to_string())?;
        f(&mut e)
    }

    /// One run under `lut`: the warm-up tokens, then the measured ones (profiled when
    /// `profiling`). Tokens per second, and the stream's stats over the measured tokens.
    fn run(
        &self,
        e: &mut Engine,
        lut: Lut,
        profiling: bool,
    ) -> Result<
        (
            f64,
            leanstream::engine::StreamStats,
            Vec<leanstream::control::LayerSample>,
        ),
        String,
    > {
        let s = e.stream_mut().expect("streamed");
        s.set_controller(Some(lut)).map_err(|e| e.to_string())?;
        s.reset_sequence();
        for (p, &t) in self.tokens[..self.warm].iter().enumerate() {
            e.forward(t, p);
        }
        let s = e.stream_mut().expect("streamed");
        s.reset_stats();
        s.set_profiling(profiling);
        let t0 = Instant::now();
        for (p, &t) in self.tokens.iter().enumerate().skip(self.warm) {
            e.forward(t, p);
        }
        let secs = t0.elapsed().as_secs_f64();
        let s = e.stream_mut().expect("streamed");
        let samples = s.take_samples();
        s.set_profiling(false);
        if let Some(err) = s.take_error() {
            return Err(format!("a read failed: {err}"));
        }
        Ok((
            (self.tokens.len() - self.warm) as f64 / secs,
            s.stats(),
            samples,
        ))
    }
}

pub(super) fn default_grid() -> Vec<StreamPlan> {
    let max = StreamPlan::board_default();
    let mut lanes = vec![1, 2, max.lanes];
    lanes.dedup();
    let mut depths = vec![4, 16, max.queue_depth];
    depths.retain(|&d| d <= max.queue_depth);
    depths.dedup();
    let mut grid = Vec::new();
    for &l in lanes.iter().filter(|&&l| l <= max.lanes) {
        for &d in &depths {
            for c in [50, 100] {
                grid.push(StreamPlan {
                    lanes: l,
                    queue_depth: d,
                    compute_percent: c,
                    prefetch: 1,
                    freq: None,
                });
            }
        }
    }
    grid
}

fn profile(a: ProfileArgs) -> Result<(), String> {
    let rig = Rig::new(&a.setup)?;
    let plans = if a.plans.is_empty() {
        default_grid()
    } else {
        a.plans.clone()
    };
    let board = leanstream::board::NAME;
    let layers = rig.image.layers();
    let mut prof = Profile {
        board: board.into(),
        model_id: rig.image.header.tables_identity,
        layers,
        plans: plans.clone(),
        steps: Vec::new(),
        runs: Vec::new(),
    };
    rig.with_engine(|e| {
        eprintln!(
            "profiling {} plans x {} repeats, {} measured tokens each (reads: {})",
            plans.len(),
            a.setup.repeats,
            a.setup.tokens,
            if e.stream_mut().expect("streamed").direct() {
                "O_DIRECT"
            } else {
                "page cache"
            }
        );
        for rep in 0..a.setup.repeats {
            for (i, plan) in plans.iter().enumerate() {
                let lut = Lut::single(board, *plan, layers).map_err(|e| e.to_string())?;
                let (tps, st, samples) = rig.run(e, lut, true)?;
                let measured = (rig.tokens.len() - rig.warm) as u64;
                prof.add_run(i as u16, &samples, measured, measured as f64 / tps);
                eprintln!(
                    "repeat {rep} plan {i} ({}): {tps:.2} tok/s, {:.0} KiB/token, miss {:.3}",
                    plan.label(),
                    st.bytes_per_token() / 1024.0,
                    st.cache.miss_ratio()
                );
            }
        }
        Ok(())
    })?;
    write_profile(&prof, &a.out)
}

/// Writes `prof` (JSON) to `out`, saying its best static plan.
pub(super) fn write_profile(prof: &Profile, out: &Path) -> Result<(), String> {
    let json = serde_json::to_string(prof).map_err(|e| e.to_string())?;
    std::fs::write(out, json).map_err(|e| format!("{}: {e}", out.display()))?;
    if let Some((p, tps)) = prof.best_static() {
        eprintln!(
            "best static plan: {p} ({}) at {tps:.2} tok/s",
            prof.plans[p].label()
        );
    }
    eprintln!("wrote {} ({} layer-steps)", out.display(), prof.steps.len());
    Ok(())
}

pub(super) fn read_profile(path: &Path) -> Result<Profile, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a controller profile: {e}", path.display()))
}

fn solve_cmd(a: SolveArgs) -> Result<(), String> {
    let prof = read_profile(&a.profile)?;
    let cost = CostModel {
        energy_weight: a.energy_weight,
        ..CostModel::default()
    };
    let model = Model::from_profile(&prof, a.states, cost)?;
    let horizon = a.horizon.unwrap_or(prof.layers);
    let fallback = prof.best_static().map_or(0, |(p, _)| p);
    let lut = solve(
        &prof.board,
        &prof.plans,
        &model,
        horizon,
        a.energy_weight,
        fallback,
    )
    .map_err(|e| e.to_string())?;
    lut.write(&a.out, prof.model_id)
        .map_err(|e| e.to_string())?;
    // How often each plan is chosen, over the table's cells.
    let mut uses = vec![0usize; prof.plans.len()];
    for n in 0..lut.layers() {
        for q in 0..lut.states() {
            uses[lut.entry(n, q)] += 1;
        }
    }
    for (p, &u) in uses.iter().enumerate().filter(|(_, &u)| u > 0) {
        eprintln!(
            "plan {p} ({}): {u} of {} cells",
            prof.plans[p].label(),
            lut.layers() * lut.states()
        );
    }
    eprintln!(
        "wrote {}: {} layers x {} states, horizon {horizon}, energy weight {}",
        a.out.display(),
        lut.layers(),
        lut.states(),
        a.energy_weight
    );
    Ok(())
}

/// Table 5's files: the LUT, the profile whose best static plan is a row, the Markdown out.
#[derive(Args)]
pub struct Table5Files {
    /// The LUT (`controller solve`).
    #[arg(long)]
    lut: PathBuf,
    /// The profile the best static plan is taken from (its fastest plan).
    #[arg(long)]
    profile: PathBuf,
    /// Markdown table.
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Table5Files {
    /// Table 5's rows: the board's fixed plan, the profile's best static plan and the LUT
    /// (read for the model `model_id`), each as a LUT over `layers`.
    pub(super) fn configs(
        &self,
        model_id: u64,
        layers: usize,
    ) -> Result<Vec<(String, Lut)>, String> {
        let prof = read_profile(&self.profile)?;
        let board = leanstream::board::NAME;
        let lut =
            Lut::read(&self.lut, model_id).map_err(|e| format!("{}: {e}", self.lut.display()))?;
        let (best, _) = prof.best_static().ok_or("the profile has no timed run")?;
        let fixed = StreamPlan::board_default();
        Ok(vec![
            (
                format!("Fix ({})", fixed.label()),
                Lut::single(board, fixed, layers).map_err(|e| e.to_string())?,
            ),
            (
                format!("Best static ({})", prof.plans[best].label()),
                Lut::single(board, prof.plans[best], layers).map_err(|e| e.to_string())?,
            ),
            ("Dynamic (LUT)".into(), lut),
        ])
    }
}

/// Table 5's figures as its runs come in: per row, each run's tok/s, and summed over the runs
/// the KiB read per token and the share of the time spent in the streamed FFN's waits.
pub(super) struct Table5 {
    names: Vec<String>,
    tps: Vec<Vec<f64>>,
    kib: Vec<f64>,
    io: Vec<f64>,
}

impl Table5 {
    pub(super) fn new(names: Vec<String>) -> Table5 {
        let n = names.len();
        Table5 {
            names,
            tps: vec![Vec::new(); n],
            kib: vec![0.0; n],
            io: vec![0.0; n],
        }
    }

    /// Run `rep` of row `i`: `tokens` measured at `t` tok/s, with the stream's counts `st`.
    pub(super) fn add(
        &mut self,
        rep: usize,
        i: usize,
        t: f64,
        tokens: usize,
        st: &leanstream::engine::StreamStats,
    ) {
        let secs = tokens as f64 / t;
        self.io[i] += st.io_wait_ns as f64 * 1e-9 / secs;
        self.kib[i] += st.bytes_per_token() / 1024.0;
        self.tps[i].push(t);
        eprintln!("repeat {rep} {}: {t:.2} tok/s", self.names[i]);
    }

    /// The table as Markdown over `repeats` runs a row (tok/s: mean, range, against the first
    /// row), printed and written to `files.out`.
    pub(super) fn write(&self, files: &Table5Files, repeats: usize) -> Result<(), String> {
        let r = repeats as f64;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let base = mean(&self.tps[0]);
        let mut md = String::from(
            "| plan | decode tok/s (mean) | min - max | vs Fix | KiB read / token | I/O wait |\n|---|---|---|---|---|---|\n",
        );
        for (i, name) in self.names.iter().enumerate() {
            let m = mean(&self.tps[i]);
            let (lo, hi) = self.tps[i]
                .iter()
                .fold((f64::MAX, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            md.push_str(&format!(
                "| {name} | {m:.2} | {lo:.2} - {hi:.2} | {:.2}x | {:.0} | {:.0}% |\n",
                m / base,
                self.kib[i] / r,
                100.0 * self.io[i] / r
            ));
        }
        print!("{md}");
        if let Some(out) = &files.out {
            std::fs::write(out, &md).map_err(|e| format!("{}: {e}", out.display()))?;
        }
        Ok(())
    }
}

fn compare(a: CompareArgs) -> Result<(), String> {
    let rig = Rig::new(&a.setup)?;
    let layers = rig.image.layers();
    let configs = a.files.configs(rig.image.header.tables_identity, layers)?;
    let mut table = Table5::new(configs.iter().map(|(n, _)| n.clone()).collect());
    rig.with_engine(|e| {
        for rep in 0..a.setup.repeats {
            for (i, (_, lut)) in configs.iter().enumerate() {
                let (t, st, _) = rig.run(e, lut.clone(), false)?;
                table.add(rep, i, t, rig.tokens.len() - rig.warm, &st);
            }
        }
        Ok(())
    })?;
    table.write(&a.files, a.setup.repeats)
}
