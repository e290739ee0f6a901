//! `leanstream stream-bench`: the streamed FFN measured on this machine's disk: decode speed,
//! cache miss ratio, bytes read per token and the share of time waiting for reads, for each
//! flash image (placement), sparsity, FFN budget and cache policy, beside the all-in-memory
//! dense and oracle engines over the same tokens, with Belady's optimal eviction computed on
//! the very block requests each run made (the floor no policy can beat). JSON, Markdown, PNG.

use super::*;
use leanstream::engine::StreamOptions;
use leanstream::model::flash::FlashImage;
use leanstream::predict::PredictKind;
use leanstream::sparsity::{BundleDown, SparsityError};
use leanstream::stream::sim::belady_from;
use leanstream::stream::{CacheBudget, Policy};
use leanstream_tools::bench::plot::{budget_lines, BudgetPlot, StreamPoint};
use leanstream_tools::bench::sets::BlockSets;

#[derive(Args)]
pub struct StreamBenchArgs {
    /// The GGUF the images were written from (the in-memory dense and oracle references).
    #[arg(long)]
    model: PathBuf,
    /// Flash images of that model, comma-separated (e.g. one per placement).
    #[arg(long, value_delimiter = ',', required = true)]
    image: Vec<PathBuf>,
    /// The text whose tokens are decoded one by one (the same tokens for every run).
    #[arg(long)]
    file: PathBuf,
    /// Tokens of the text to skip first.
    #[arg(long, default_value_t = 0)]
    skip_tokens: usize,
    /// Tokens decoded before measuring (the cache fills).
    #[arg(long, default_value_t = 16)]
    warm_tokens: usize,
    /// Tokens decoded and measured.
    #[arg(long, default_value_t = 48)]
    tokens: usize,
    /// Sparsities, comma-separated (oracle: thresholds from the first image's table).
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8")]
    sparsity: Vec<f32>,
    /// How neurons are chosen: oracle (the calibrated thresholds) or topk (the 1-S largest per
    /// token and layer; for images written without a table).
    #[arg(long, default_value = "oracle")]
    ffn: String,
    /// FFN budgets in percent of the FFN's bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,20,25,50,100")]
    budgets: Vec<f64>,
    /// Cache policies, comma-separated: lru, lfu, hot, learned (with --eviction).
    #[arg(long, value_delimiter = ',', default_value = "lru,lfu,hot")]
    cache: Vec<String>,
    /// Which blocks are read, comma-separated: oracle, stale, and the learned predictors
    /// (hash, dejavu, dejavu-stale, bnn, powerinfer2) with their tables in --predictor.
    #[arg(long, value_delimiter = ',', default_value = "oracle")]
    predict: Vec<String>,
    /// The learned predictors' tables, comma-separated KIND=FILE (powerinfer2 runs dejavu's).
    #[arg(long, value_delimiter = ',', value_name = "KIND=FILE")]
    predictor: Vec<String>,
    /// Writes the block sets every layer-step of the first streamed run asked for (warm tokens
    /// included), for `gpu-stream-bench` to replay over a same-geometry image.
    #[arg(long, value_name = "FILE")]
    record_sets: Option<PathBuf>,
    /// The learned cache policy's table (leanstream train-eviction).
    #[arg(long, value_name = "FILE")]
    eviction: Option<PathBuf>,
    /// Speculate-and-refine stages K to run each learned predictor reading prev-ffn-output
    /// with, comma-separated (0: no look-ahead; default: the engine's, 1 for such a table).
    #[arg(long, value_delimiter = ',', value_name = "K")]
    refine_stages: Vec<usize>,
    /// The streaming controller's LUT (`leanstream controller solve`) every streamed run
    /// applies per layer (default: the board's maxima).
    #[arg(long, value_name = "LUT")]
    controller: Option<PathBuf>,
    /// Adjacent blocks one disk read may cover (1: a read a block). Default: the board's
    /// io.merge_blocks.
    #[arg(long, value_name = "N")]
    merge_blocks: Option<usize>,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    /// Output prefix: PREFIX.json, PREFIX.md and PREFIX-<sparsity>.png.
    #[arg(long, default_value = "stream-bench")]
    out: PathBuf,
}

/// One measured run.
struct Run {
    label: String,
    predict: String,
    placement: String,
    policy: String,
    budget: f64,
    sparsity: f32,
    tok_per_s: f64,
    miss_ratio: f64,
    belady: f64,
    bytes_per_token: f64,
    io_wait_share: f64,
    missed_share: f64,
    direct: bool,
}

fn engine_options(threads: usize, context: usize, ffn: FfnOptions) -> EngineOptions {
    EngineOptions {
        threads,
        context,
        ffn,
        ..EngineOptions::default()
    }
}

/// Decodes `tokens` one by one: the first `warm` unmeasured, then the rest timed. Returns
/// tokens per second over the timed ones.
fn decode(e: &mut Engine, tokens: &[u32], warm: usize, mut before: impl FnMut(&mut Engine)) -> f64 {
    for (p, &t) in tokens[..warm].iter().enumerate() {
        e.forward(t, p);
    }
    before(e);
    let t0 = Instant::now();
    for (p, &t) in tokens.iter().enumerate().skip(warm) {
        e.forward(t, p);
    }
    (tokens.len() - warm) as f64 / t0.elapsed().as_secs_f64()
}

pub fn cmd_stream_bench(a: StreamBenchArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model, None)?;
    let h = file.hyper().map_err(|e| e.to_string())?;
    let text =
        std::fs::read_to_string(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let all = tok.encode(&text, false);
    let need = a.skip_tokens + a.warm_tokens + a.tokens;
    if all.len() < need || a.tokens == 0 {
        return Err(format!(
            "{}: {} tokens, {need} needed (skip + warm + measured, measured > 0)",
            a.file.display(),
            all.len()
        ));
    }
    let tokens = &all[a.skip_tokens..need];
    let threads = a
        .threads
        .map(threads_at_least_one)
        .unwrap_or(leanstream::board::CPU_THREADS);
    let context = tokens.len() + 1;
    let predicts: Vec<PredictKind> = a
        .predict
        .iter()
        .map(|p| PredictKind::parse(p).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut tables = std::collections::HashMap::new();
    for kv in &a.predictor {
        let (k, f) = kv
            .split_once('=')
            .ok_or_else(|| format!("--predictor {kv}: expected KIND=FILE"))?;
        tables.insert(
            PredictKind::parse(k).map_err(|e| e.to_string())?,
            PathBuf::from(f),
        );
    }
    let table_of = |p: PredictKind| -> Result<Option<PathBuf>, String> {
        if !p.needs_table() {
            return Ok(None);
        }
        let key = match p {
            PredictKind::PowerInfer2 => PredictKind::Dejavu,
            other => other,
        };
        tables.get(&key).cloned().map(Some).ok_or_else(|| {
            format!(
                "--predict {}: give its table as --predictor {}=FILE",
                p.name(),
                key.name()
            )
        })
    };
    let policies: Vec<Policy> = a
        .cache
        .iter()
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    let images: Vec<FlashImage> = a
        .image
        .iter()
        .map(|p| FlashImage::open(p).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let name = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();

    // The all-in-memory dense engine.
    let dense_tps = {
        let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
        let mut e = Engine::boot(
            &mut arenas,
            &file,
            engine_options(threads, context, FfnOptions::default()),
        )
        .map_err(|e| format!("{}: {e}", a.model.display()))?;
        decode(&mut e, tokens, a.warm_tokens, |_| {})
    };
    eprintln!("{name}: dense in memory {dense_tps:.2} tok/s");
    let mut runs = Vec::new();
    let mut oracle_tps = Vec::new();
    let mut sets_written = false;
    let mode: FfnMode = a.ffn.parse().map_err(|e: SparsityError| e.to_string())?;
    if mode == FfnMode::Dense {
        return Err("--ffn dense streams every block: give oracle or topk".into());
    }
    let table = if mode == FfnMode::Oracle {
        Some(
            ThresholdTable::from_image(&images[0], &h)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!(
                        "{}: the image has no thresholds table (use --ffn topk)",
                        a.image[0].display()
                    )
                })?,
        )
    } else {
        None
    };
    for &sparsity in &a.sparsity {
        let ffn = FfnOptions {
            mode,
            score: Score::Glu,
            sparsity,
            thresholds: table
                .as_ref()
                .map(|t| t.thresholds(sparsity, Score::Glu))
                .transpose()
                .map_err(|e| e.to_string())?,
            bundle_down: BundleDown::AtLeast8Bit,
            dropped: table
                .as_ref()
                .map(|t| t.dropped_mean(sparsity, Score::Glu))
                .transpose()
                .map_err(|e| e.to_string())?,
        };
        // The in-memory oracle: every bundle resident, the same neurons.
        let tps = {
            let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
            let mut e = Engine::boot(
                &mut arenas,
                &file,
                engine_options(threads, context, ffn.clone()),
            )
            .map_err(|e| format!("{}: {e}", a.model.display()))?;
            decode(&mut e, tokens, a.warm_tokens, |_| {})
        };
        eprintln!("{name}: {} in memory {tps:.2} tok/s", ffn.label());
        oracle_tps.push(tps);
        for (img, path) in images.iter().zip(&a.image) {
            let dense_part = img.dense_model().map_err(|e| e.to_string())?;
            for (&policy, &predict) in policies
                .iter()
                .flat_map(|p| predicts.iter().map(move |q| (p, q)))
            {
                // PowerInfer-2 is its predictor beside its own cache policy only.
                if predict == PredictKind::PowerInfer2 && policy != Policy::Hot {
                    continue;
                }
                let refines: Vec<Option<usize>> =
                    if a.refine_stages.is_empty() || !predict.needs_table() {
                        vec![None]
                    } else {
                        a.refine_stages.iter().map(|&k| Some(k)).collect()
                    };
                for (&budget, refine) in a
                    .budgets
                    .iter()
                    .flat_map(|b| refines.iter().map(move |r| (b, *r)))
                {
                    let predict_name = match refine {
                        Some(k) => format!("{} K{k}", predict.name()),
                        None => predict.name().to_string(),
                    };
                    let so = StreamOptions {
                        image: path.clone(),
                        budget: CacheBudget::Fraction(budget / 100.0),
                        policy,
                        predict,
                        predictor: table_of(predict)?,
                        eviction: (policy == Policy::Learned)
                            .then(|| a.eviction.clone())
                            .flatten(),
                        refine_stages: refine,
                        controller: a.controller.clone(),
                        hot: Vec::new(),
                        faults: Vec::new(),
                        shuffle: None,
                        replay: None,
                        merge_blocks: a.merge_blocks,
                    };
                    let mut o = engine_options(threads, context, ffn.clone());
                    o.stream = Some(so);
                    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
                    let label = format!(
                        "{} {} {budget}% {predict_name}",
                        img.header.placement,
                        policy.name(),
                    );
                    let mut e = match Engine::boot(&mut arenas, &dense_part, o) {
                        Ok(e) => e,
                        Err(err) => {
                            eprintln!("{name}: {label}: not run: {err}");
                            continue;
                        }
                    };
                    // Every layer-step is recorded; Belady's misses count from where the
                    // measurement starts, on a cache warmed by the same steps.
                    e.stream_mut().expect("streamed").set_recording(true);
                    let mut warm_steps = 0;
                    let tps = decode(&mut e, tokens, a.warm_tokens, |e| {
                        let s = e.stream_mut().expect("streamed");
                        s.reset_stats();
                        warm_steps = s.recorded_steps();
                    });
                    let s = e.stream_mut().expect("streamed");
                    let st = s.stats();
                    let steps = s.take_recorded();
                    if let Some(p) = a.record_sets.as_ref().filter(|_| !sets_written) {
                        BlockSets::new(img, steps.clone()).write(p)?;
                        eprintln!(
                            "{name}: {label}: {} layer-steps of block sets in {}",
                            steps.len(),
                            p.display()
                        );
                        sets_written = true;
                    }
                    let (slots, _) = s.cache_slots();
                    let floor = belady_from(slots, &steps, warm_steps);
                    let measured = a.tokens as f64 / tps;
                    let run = Run {
                        label,
                        predict: predict_name,
                        placement: img.header.placement.clone(),
                        policy: policy.name().into(),
                        budget,
                        sparsity,
                        tok_per_s: tps,
                        miss_ratio: st.cache.miss_ratio(),
                        belady: floor.miss_ratio(),
                        bytes_per_token: st.bytes_per_token(),
                        io_wait_share: st.io_wait_ns as f64 / 1e9 / measured.max(1e-9),
                        missed_share: st.missed as f64 / st.chosen.max(1) as f64,
                        direct: s.direct(),
                    };
                    eprintln!(
                        "{name}: {} at {sparsity}: {:.2} tok/s, miss {:.3} (Belady {:.3}), {:.0} KiB/token, I/O wait {:.0}%",
                        run.label,
                        run.tok_per_s,
                        run.miss_ratio,
                        run.belady,
                        run.bytes_per_token / 1024.0,
                        run.io_wait_share * 100.0
                    );
                    runs.push(run);
                }
            }
        }
    }
    write_outputs(&a, &name, threads, dense_tps, &oracle_tps, &runs)
}

fn write_outputs(
    a: &StreamBenchArgs,
    name: &str,
    threads: usize,
    dense_tps: f64,
    oracle_tps: &[f64],
    runs: &[Run],
) -> Result<(), String> {
    let with_ext = |ext: &str| {
        let mut p = a.out.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let direct = runs.iter().all(|r| r.direct);
    let mut md = format!(
        "{name}, {threads} threads, {} measured tokens after {} warm-up tokens of {}; reads {}.\n\nDense in memory: {dense_tps:.2} tok/s.",
        a.tokens,
        a.warm_tokens,
        a.file.file_name().unwrap_or_default().to_string_lossy(),
        if direct { "with O_DIRECT" } else { "through the page cache (O_DIRECT refused)" }
    );
    for (s, t) in a.sparsity.iter().zip(oracle_tps) {
        md.push_str(&format!(" {} {s} in memory: {t:.2} tok/s.", a.ffn));
    }
    md.push_str("\n\n| sparsity | placement | predict | policy | budget | decode tok/s | vs in memory | miss ratio | Belady | KiB read/token | I/O wait share | chosen neurons not read |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut json_rows = Vec::new();
    for r in runs {
        let oracle = a
            .sparsity
            .iter()
            .position(|&s| s == r.sparsity)
            .map(|i| oracle_tps[i])
            .unwrap_or(f64::NAN);
        md.push_str(&format!(
            "| {} | {} | {} | {} | {}% | {:.2} | {:.2}x | {:.3} | {:.3} | {:.0} | {:.0}% | {:.3} |\n",
            r.sparsity,
            r.placement,
            r.predict,
            r.policy,
            r.budget,
            r.tok_per_s,
            r.tok_per_s / oracle,
            r.miss_ratio,
            r.belady,
            r.bytes_per_token / 1024.0,
            r.io_wait_share * 100.0,
            r.missed_share
        ));
        json_rows.push(format!(
            "    {{\"sparsity\": {}, \"placement\": {:?}, \"predict\": {:?}, \"policy\": {:?}, \"budget_percent\": {}, \"decode_tok_per_s\": {:.3}, \"miss_ratio\": {:.4}, \"belady_miss_ratio\": {:.4}, \"bytes_per_token\": {:.0}, \"io_wait_share\": {:.4}, \"missed_share\": {:.4}}}",
            r.sparsity, r.placement, r.predict, r.policy, r.budget, r.tok_per_s, r.miss_ratio, r.belady, r.bytes_per_token, r.io_wait_share, r.missed_share
        ));
    }
    let json = format!(
        "{{\n  \"model\": {name:?},\n  \"board\": {:?},\n  \"threads\": {threads},\n  \"tokens\": {},\n  \"warm_tokens\": {},\n  \"o_direct\": {direct},\n  \"dense_tok_per_s\": {dense_tps:.3},\n  \"oracle_tok_per_s\": {oracle_tps:?},\n  \"runs\": [\n{}\n  ]\n}}\n",
        leanstream::board::NAME,
        a.tokens,
        a.warm_tokens,
        json_rows.join(",\n")
    );
    std::fs::write(with_ext(".json"), json).map_err(|e| e.to_string())?;
    std::fs::write(with_ext(".md"), &md).map_err(|e| e.to_string())?;
    for (i, &s) in a.sparsity.iter().enumerate() {
        let points: Vec<StreamPoint> = runs
            .iter()
            .filter(|r| r.sparsity == s)
            .map(|r| StreamPoint {
                series: if a.predict.len() > 1 {
                    format!("{} {} {}", r.placement, r.predict, r.policy)
                } else {
                    format!("{} {}", r.placement, r.policy)
                },
                budget: r.budget,
                tok_per_s: r.tok_per_s,
                right: r.miss_ratio,
                floor: r.belady,
            })
            .collect();
        let title = format!(
            "{name}, {} at sparsity {s}: streamed FFN on this disk",
            a.ffn
        );
        budget_lines(
            &points,
            &BudgetPlot {
                title: &title,
                references: &[
                    (dense_tps, "dense in memory"),
                    (oracle_tps[i], "sparse in memory"),
                ],
                log_speed: false,
                right_desc: "miss ratio (dashed: Belady on the same requests)",
                right_max: 1.0,
            },
            &with_ext(&format!("-{s}.png")),
        )?;
    }
    print!("{md}");
    Ok(())
}
