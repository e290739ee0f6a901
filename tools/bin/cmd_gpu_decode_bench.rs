//! `leanstream gpu-decode-bench`: whole decode steps on the GPU with the FFN streamed from a
//! flash image on this machine's disk (engine/cuda_stream.rs), the blocks each layer-step asks
//! for replayed from sets recorded from a real model's decode (`stream-bench --record-sets`,
//! possibly on another machine: a same-geometry image replays them block for block), against
//! the same model decoded with every weight in memory. Per memory model, set file (a predictor's
//! choices), cache policy and FFN budget: decode tok/s, bytes read per token beside Belady's
//! floor for that cache and those sets, the hit ratio, and the share of the step spent in the
//! streamed FFN. Each memory model's streamed decoder is first checked against the CPU's
//! streamed decoder over the same replayed blocks (one token's logits).

use super::*;

#[derive(Args)]
pub struct GpuDecodeBenchArgs {
    /// The flash image (w8a8 or F16 blocks: `flash --precision w8a8`).
    #[arg(long)]
    image: PathBuf,
    /// The GGUF the image was written from: decoded with every weight in memory (`dense`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Block sets to replay, comma-separated (`stream-bench --record-sets`); each is named by
    /// its file stem, or `NAME=PATH`.
    #[arg(long, value_delimiter = ',', required = true)]
    sets: Vec<String>,
    /// FFN budgets in percent of the image's FFN bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,20,50,100")]
    budgets: Vec<f64>,
    /// Cache policies, comma-separated: lru, lfu, hot (the sets' most used blocks pinned, as
    /// PowerInfer-2's offline profile would pin them; the rest LFU), learned (needs
    /// --eviction).
    #[arg(long, value_delimiter = ',', default_value = "lru")]
    cache: Vec<String>,
    /// The `learned` policy's reuse-distance table (`leanstream train-eviction`), trained on
    /// the real model's access stream: keyed again to this image (as the sets replay that
    /// model's requests over it).
    #[arg(long)]
    eviction: Option<PathBuf>,
    /// Also runs the ablation of the paper's figure 11 over each sets file and budget:
    /// `layer-wise` (reads in layout order, the kernel once the layer is in, LRU), then
    /// +prioritized compute (each block computed as it lands), +prioritized loading (reads
    /// highest priority first), +prioritized caching (this policy).
    #[arg(long, value_name = "POLICY")]
    ablation: Option<String>,
    /// Adjacent blocks one disk read may cover, comma-separated: each value runs every
    /// configuration above (1,16 compares a read a block with merged reads; the ablation runs
    /// at the first). Default: the board's io.merge_blocks.
    #[arg(long, value_delimiter = ',', value_name = "N")]
    merge_blocks: Vec<usize>,
    /// Memory models, comma-separated: discrete (device copies of the cache) and unified (the
    /// kernel reads the cache in mapped host memory, as on a Jetson).
    #[arg(long, value_delimiter = ',', default_value = "discrete")]
    memory: Vec<String>,
    /// Tokens decoded before measuring (the cache fills).
    #[arg(long, default_value_t = 8)]
    warm_tokens: usize,
    /// Tokens measured.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Markdown table output.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// JSON output.
    #[arg(long)]
    json: Option<PathBuf>,
    /// PNG output: decode tok/s against the budget per sets and policy (the in-memory speed
    /// as a line), and bytes read per token with Belady's floor.
    #[arg(long)]
    png: Option<PathBuf>,
    /// Runs nothing: the table and PNG again from a run's --json (no GPU needed).
    #[arg(long, value_name = "JSON", conflicts_with = "json")]
    replot: Option<PathBuf>,
}

/// One configuration's figures (a JSON row).
#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    memory: String,
    sets: String,
    /// `default` (the engine's schedule: `Prioritization::default`), or the ablation's step;
    /// runs from before the ablation read as `prioritized` (they asked by priority).
    #[serde(default = "prioritized")]
    schedule: String,
    /// Adjacent blocks one read could cover; runs from before merged reads read a block at a
    /// time.
    #[serde(default = "one")]
    merge_blocks: usize,
    cache: String,
    budget: f64,
    tok_s: f64,
    vs_dense: f64,
    mib_read_per_token: f64,
    belady_mib_per_token: f64,
    hit_ratio: f64,
    /// NaN for the in-memory row (JSON null).
    #[serde(deserialize_with = "null_is_nan")]
    ffn_share: f64,
}

fn one() -> usize {
    1
}

fn prioritized() -> String {
    "prioritized".into()
}

fn null_is_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    use serde::Deserialize;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

pub fn cmd_gpu_decode_bench(a: GpuDecodeBenchArgs) -> Result<(), String> {
    if let Some(p) = &a.replot {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let rows: Vec<Row> =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        return report(&a, &format!("{} (replotted)", p.display()), &rows);
    }
    run(a)
}

#[cfg(not(feature = "cuda"))]
fn run(_: GpuDecodeBenchArgs) -> Result<(), String> {
    Err("this build has no CUDA backend (built without the cuda feature)".into())
}

#[cfg(feature = "cuda")]
fn run(a: GpuDecodeBenchArgs) -> Result<(), String> {
    gpu::run(a)
}

/// The table (printed, and --markdown), --json and --png of `rows`; `header` names the run.
fn report(a: &GpuDecodeBenchArgs, header: &str, rows: &[Row]) -> Result<(), String> {
    use leanstream_tools::bench::plot::{budget_lines, BudgetPlot, StreamPoint};
    let mut md = format!(
        "{header}\n\n\
         | memory | sets | schedule | merge | cache | FFN budget | decode tok/s | vs dense | MiB read/token | Belady MiB/token | hit ratio | FFN share of the step |\n\
         |---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows {
        md += &format!(
            "| {} | {} | {} | {} | {} | {}% | {:.2} | {:.4}x | {:.2} | {:.2} | {:.3} | {:.0}% |\n",
            r.memory,
            r.sets,
            if r.sets == "dense" { "-" } else { &r.schedule },
            if r.sets == "dense" {
                "-".to_string()
            } else {
                r.merge_blocks.to_string()
            },
            r.cache,
            r.budget,
            r.tok_s,
            r.vs_dense,
            r.mib_read_per_token,
            r.belady_mib_per_token,
            r.hit_ratio,
            100.0 * r.ffn_share
        );
    }
    print!("{md}");
    if let Some(p) = &a.markdown {
        std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &a.json {
        let j = serde_json::to_string_pretty(rows).map_err(|e| e.to_string())?;
        std::fs::write(p, j).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &a.png {
        let memories: Vec<&str> = rows.iter().fold(Vec::new(), |mut v, r| {
            if !v.contains(&r.memory.as_str()) {
                v.push(&r.memory);
            }
            v
        });
        let merges = rows.iter().fold(Vec::new(), |mut v, r| {
            if r.sets != "dense" && !v.contains(&r.merge_blocks) {
                v.push(r.merge_blocks);
            }
            v
        });
        let points: Vec<StreamPoint> = rows
            .iter()
            // The ablation's steps are in the table only.
            .filter(|r| {
                r.sets != "dense" && matches!(r.schedule.as_str(), "default" | "prioritized")
            })
            .map(|r| StreamPoint {
                series: match (memories.len() > 1, merges.len() > 1) {
                    (true, true) => {
                        format!(
                            "{} {} {} merge {}",
                            r.memory, r.sets, r.cache, r.merge_blocks
                        )
                    }
                    (true, false) => format!("{} {} {}", r.memory, r.sets, r.cache),
                    (false, true) => format!("{} {} merge {}", r.sets, r.cache, r.merge_blocks),
                    (false, false) => format!("{} {}", r.sets, r.cache),
                },
                budget: r.budget,
                tok_per_s: r.tok_s,
                right: r.mib_read_per_token,
                floor: r.belady_mib_per_token,
            })
            .collect();
        let dense: Vec<(f64, String)> = rows
            .iter()
            .filter(|r| r.sets == "dense")
            .map(|r| (r.tok_s, format!("{} in memory", r.memory)))
            .collect();
        let references: Vec<(f64, &str)> = dense.iter().map(|(v, n)| (*v, n.as_str())).collect();
        let right_max = points.iter().map(|p| p.right).fold(1.0, f64::max) * 1.1;
        let title = format!(
            "{}: decode with the FFN streamed on the GPU, replayed sets",
            header.split(':').next().unwrap_or(header)
        );
        budget_lines(
            &points,
            &BudgetPlot {
                title: &title,
                references: &references,
                log_speed: true,
                right_desc: "MiB read per token (dashed: Belady on the same requests)",
                right_max,
            },
            p,
        )?;
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub(crate) mod gpu {
    use super::*;
    use leanstream::board::MemoryModel;
    use leanstream::engine::cuda::{CudaEngine, Prioritization, StreamedBoot};
    use leanstream::engine::cuda_options::CudaOptions;
    use leanstream::engine::stream_ffn::{hot_count, most_used};
    use leanstream::engine::{Arenas, Decoder, Engine, EngineOptions, StreamOptions, StreamedFfn};
    use leanstream::model::flash::FlashImage;
    use leanstream::predict::reuse::ReuseTable;
    use leanstream::predict::PredictKind;
    use leanstream::sparsity::{FfnMode, FfnOptions, Score};
    use leanstream::stream::{sim, BlockId, CacheBudget, LaneConfig, Policy};
    use leanstream_tools::bench::rel_err;
    use leanstream_tools::bench::sets::BlockSets;
    use std::sync::Arc;
    use std::time::Instant;

    /// The int8 parity gate of the CUDA backend against the CPU's (tests/cuda.rs).
    const GATE: f64 = 5e-2;

    pub(crate) fn err(e: impl std::fmt::Display) -> String {
        e.to_string()
    }

    /// The FFN options every configuration runs: the kernel keeps every neuron of the blocks
    /// read (the weights are random: which neurons a threshold keeps means nothing here; what
    /// is read is the sets').
    pub(crate) fn ffn(layers: usize) -> FfnOptions {
        FfnOptions {
            mode: FfnMode::Oracle,
            score: Score::Glu,
            sparsity: 0.0,
            thresholds: Some(vec![0.0; layers]),
            bundle_down: leanstream_tools::offline::flash::BUNDLE_DOWN,
            dropped: None,
        }
    }

    /// PowerInfer-2's pinned set: the blocks the sets use most, as many as the engine's `hot`
    /// policy takes from a profile (half the slots, a whole layer and the reads in flight
    /// still free).
    pub(crate) fn hot_blocks(
        img: &FlashImage,
        steps: &[Vec<BlockId>],
        budget: CacheBudget,
    ) -> Vec<BlockId> {
        let (slots, slot_bytes) = StreamedFfn::slots(img, budget);
        let largest = (0..img.layers()).map(|l| img.blocks(l)).max().unwrap_or(0);
        let cfg = LaneConfig::from_board(slot_bytes);
        let total: usize = (0..img.layers()).map(|l| img.blocks(l)).sum();
        let mut freq = vec![0u32; total];
        for &b in steps.iter().flatten() {
            freq[b as usize] += 1;
        }
        let busy = largest + cfg.lanes * cfg.queue_depth;
        most_used(&freq, hot_count(slots, busy))
    }

    pub(crate) fn stream_options(
        image: &Path,
        budget: CacheBudget,
        policy: Policy,
        replay: &Arc<Vec<Vec<BlockId>>>,
        hot: Vec<BlockId>,
    ) -> StreamOptions {
        StreamOptions {
            image: image.to_path_buf(),
            budget,
            policy,
            predict: PredictKind::Oracle,
            predictor: None,
            eviction: None,
            refine_stages: None,
            controller: None,
            hot,
            faults: Vec::new(),
            shuffle: None,
            replay: Some(replay.clone()),
            merge_blocks: None,
        }
    }

    /// Greedy decoding of positions `range` from `tok`; the last token.
    pub(crate) fn decode(
        d: &mut dyn Decoder,
        mut tok: u32,
        range: std::ops::Range<usize>,
    ) -> Result<u32, String> {
        for pos in range {
            tok = d.forward_greedy(tok, pos);
            if let Some(e) = d.take_error() {
                return Err(format!("token {pos}: {e}"));
            }
        }
        Ok(tok)
    }

    pub(crate) fn memory_model(m: &str) -> Result<MemoryModel, String> {
        match m {
            "discrete" => Ok(MemoryModel::Discrete),
            "unified" => Ok(MemoryModel::Unified),
            other => Err(format!("--memory: unified or discrete, not {other}")),
        }
    }

    /// What every configuration of one memory model shares.
    struct Run<'r> {
        a: &'r GpuDecodeBenchArgs,
        img: &'r FlashImage,
        dense_part: &'r leanstream::model::ModelFile,
        cuda: CudaOptions,
        memory: &'r str,
        dense_tok_s: Option<f64>,
        eviction: Option<&'r Path>,
    }

    impl Run<'_> {
        /// One configuration's row (None: it does not boot at this budget, said on stderr).
        fn measure(
            &self,
            name: &str,
            steps: &Arc<Vec<Vec<BlockId>>>,
            policy: Policy,
            b: f64,
            (p, schedule): (Prioritization, &str),
            merge: usize,
        ) -> Result<Option<Row>, String> {
            let (a, img, m) = (self.a, self.img, self.memory);
            let layers = img.layers();
            let c = policy.name();
            let budget = CacheBudget::Fraction(b / 100.0);
            let hot = if policy == Policy::Hot {
                hot_blocks(img, steps, budget)
            } else {
                Vec::new()
            };
            let mut so = stream_options(&a.image, budget, policy, steps, hot);
            so.merge_blocks = Some(merge);
            if policy == Policy::Learned {
                so.eviction = Some(
                    self.eviction
                        .ok_or("the learned cache policy needs its table: --eviction")?
                        .to_path_buf(),
                );
            }
            let f = ffn(layers);
            let mut arenas = Arenas::from_board().map_err(err)?;
            let boot = StreamedBoot {
                stream: &so,
                ffn: &f,
            };
            let mut e =
                match CudaEngine::boot_streamed(&mut arenas, self.dense_part, self.cuda, boot) {
                    Ok(e) => e,
                    Err(e) => {
                        eprintln!("{m} {name} {schedule} merge {merge} {c} {b}%: skipped: {e}");
                        return Ok(None);
                    }
                };
            e.set_prioritization(p);
            e.begin_sequence();
            let tok = decode(&mut e, 1, 0..a.warm_tokens)?;
            // Timed from a warm cache, the counts from there.
            e.reset_stream_stats();
            let t = Instant::now();
            decode(&mut e, tok, a.warm_tokens..a.warm_tokens + a.tokens)?;
            let secs = t.elapsed().as_secs_f64();
            let st = e.stream_stats().expect("streamed");
            let tok_s = a.tokens as f64 / secs;
            let (slots, _) = StreamedFfn::slots(img, budget);
            let floor = sim::belady_from(slots, steps, a.warm_tokens * layers);
            let measured_steps = (steps.len() - (a.warm_tokens * layers).min(steps.len())).max(1);
            let block_bytes = img.geometry(0).block_bytes as f64;
            let floor_per_token =
                floor.misses as f64 * block_bytes * layers as f64 / measured_steps as f64;
            let mib = 1048576.0;
            let row = Row {
                memory: m.to_string(),
                sets: name.to_string(),
                schedule: schedule.to_string(),
                merge_blocks: merge,
                cache: c.to_string(),
                budget: b,
                tok_s,
                vs_dense: self.dense_tok_s.map_or(f64::NAN, |d| tok_s / d),
                mib_read_per_token: st.bytes_per_token() / mib,
                belady_mib_per_token: floor_per_token / mib,
                hit_ratio: st.hit_ratio(),
                ffn_share: st.io_wait_ns as f64 / 1e9 / secs,
            };
            eprintln!(
                "{m} {name} {schedule} merge {merge} {c} {b}%: {:.2} tok/s, {:.2} MiB read/token (Belady {:.2}), hit {:.3}",
                row.tok_s, row.mib_read_per_token, row.belady_mib_per_token, row.hit_ratio
            );
            Ok(Some(row))
        }
    }

    /// The `learned` policy's table `path` (made for the real model) keyed again to `img`, in
    /// a file beside the system's temporary files; its path.
    fn rekeyed_eviction(path: &Path, img: &FlashImage) -> Result<PathBuf, String> {
        let at = |e: &dyn std::fmt::Display| format!("--eviction {}: {e}", path.display());
        let bytes = leanstream::tables::read_bytes(path).map_err(|e| at(&e))?;
        // The header's model identity (tables/mod.rs: magic, kind, version, then it).
        let id = bytes
            .get(16..24)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .ok_or_else(|| at(&"not a LeanStream table file"))?;
        let table = ReuseTable::decode(&bytes, id).map_err(|e| at(&e))?;
        let out = std::env::temp_dir().join(format!(
            "leanstream-eviction-{}-{:016x}.reuse",
            std::process::id(),
            img.header.tables_identity
        ));
        std::fs::write(&out, table.encode(img.header.tables_identity))
            .map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(out)
    }

    pub fn run(a: GpuDecodeBenchArgs) -> Result<(), String> {
        let img = FlashImage::open(&a.image).map_err(|e| format!("{}: {e}", a.image.display()))?;
        img.check_board(leanstream::board::NAME)
            .map_err(|e| format!("{}: {e}", a.image.display()))?;
        let dense_part = img.dense_model().map_err(err)?;
        let layers = img.layers();
        let context = a.warm_tokens + a.tokens + 1;
        let mut sets = Vec::new();
        for s in &a.sets {
            let (name, path) = match s.split_once('=') {
                Some((n, p)) => (n.to_string(), PathBuf::from(p)),
                None => (
                    Path::new(s)
                        .file_stem()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    PathBuf::from(s),
                ),
            };
            let bs = BlockSets::read(&path)?;
            bs.check_image(&img)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if bs.steps.len() < layers {
                return Err(format!(
                    "{}: fewer steps than the image has layers",
                    path.display()
                ));
            }
            sets.push((name, Arc::new(bs.steps)));
        }
        let wants_learned = a.cache.iter().chain(&a.ablation).any(|c| c == "learned");
        let eviction = match &a.eviction {
            Some(p) if wants_learned => Some(rekeyed_eviction(p, &img)?),
            _ => None,
        };
        let mut rows = Vec::new();
        for m in &a.memory {
            let memory = memory_model(m)?;
            let cuda = CudaOptions {
                memory,
                context,
                ..CudaOptions::default()
            };
            // Every weight in memory: the same-shape GGUF.
            let dense_tok_s = match &a.model {
                Some(p) => {
                    let file = leanstream::model::ModelFile::open(p).map_err(err)?;
                    let mut arenas = Arenas::from_board().map_err(err)?;
                    let mut e = CudaEngine::boot(&mut arenas, &file, cuda).map_err(err)?;
                    let tok = decode(&mut e, 1, 0..a.warm_tokens)?;
                    let started = Instant::now();
                    decode(&mut e, tok, a.warm_tokens..a.warm_tokens + a.tokens)?;
                    let t = a.tokens as f64 / started.elapsed().as_secs_f64();
                    eprintln!("{m} dense: {t:.1} tok/s");
                    Some(t)
                }
                None => None,
            };
            // The parity gate: one token's logits, GPU against CPU, the same blocks replayed.
            {
                let (name, steps) = &sets[0];
                let so = stream_options(
                    &a.image,
                    CacheBudget::Fraction(1.0),
                    Policy::Lru,
                    steps,
                    Vec::new(),
                );
                let f = ffn(layers);
                let cpu_logits = {
                    let mut arenas = Arenas::from_board().map_err(err)?;
                    let opts = EngineOptions {
                        context,
                        ffn: f.clone(),
                        stream: Some(so.clone()),
                        ..Default::default()
                    };
                    let mut e = Engine::boot(&mut arenas, &dense_part, opts).map_err(err)?;
                    e.forward(1, 0).to_vec()
                };
                let mut arenas = Arenas::from_board().map_err(err)?;
                let boot = StreamedBoot {
                    stream: &so,
                    ffn: &f,
                };
                let mut e =
                    CudaEngine::boot_streamed(&mut arenas, &dense_part, cuda, boot).map_err(err)?;
                let r = rel_err(e.forward(1, 0), &cpu_logits);
                eprintln!(
                    "{m} parity ({name}): logits rel {r:.2e} against the CPU's streamed decoder"
                );
                if r.is_nan() || r > GATE {
                    return Err(format!(
                        "{m}: the GPU's streamed decode is {r:.2e} from the CPU's (gate {GATE})"
                    ));
                }
            }
            let run = Run {
                a: &a,
                img: &img,
                dense_part: &dense_part,
                cuda,
                memory: m,
                dense_tok_s,
                eviction: eviction.as_deref(),
            };
            let merges = if a.merge_blocks.is_empty() {
                vec![leanstream::board::IO_MERGE_BLOCKS]
            } else {
                a.merge_blocks.clone()
            };
            for (name, steps) in &sets {
                for c in &a.cache {
                    let policy: Policy = c.parse()?;
                    for &b in &a.budgets {
                        for &merge in &merges {
                            let p = Prioritization::default();
                            let row = run.measure(name, steps, policy, b, (p, "default"), merge)?;
                            rows.extend(row);
                        }
                    }
                }
                let Some(last) = &a.ablation else { continue };
                let last: Policy = last.parse()?;
                for &b in &a.budgets {
                    for (step, policy, compute, loading) in [
                        ("layer-wise", Policy::Lru, false, false),
                        ("+compute", Policy::Lru, true, false),
                        ("+loading", Policy::Lru, true, true),
                        ("+caching", last, true, true),
                    ] {
                        let p = Prioritization { compute, loading };
                        rows.extend(run.measure(name, steps, policy, b, (p, step), merges[0])?);
                    }
                }
            }
            if let Some(d) = dense_tok_s {
                rows.push(Row {
                    memory: m.clone(),
                    sets: "dense".into(),
                    schedule: "-".into(),
                    merge_blocks: 1,
                    cache: "-".into(),
                    budget: 100.0,
                    tok_s: d,
                    vs_dense: 1.0,
                    mib_read_per_token: 0.0,
                    belady_mib_per_token: 0.0,
                    hit_ratio: 1.0,
                    ffn_share: f64::NAN,
                });
            }
        }
        let header = format!(
            "{}: {} layers, {} measured tokens after {} warm-up tokens, replayed sets; reads with O_DIRECT.",
            a.image.display(),
            layers,
            a.tokens,
            a.warm_tokens
        );
        report(&a, &header, &rows)
    }
}
