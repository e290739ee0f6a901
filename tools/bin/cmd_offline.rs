//! The offline commands: `calibrate` (activation thresholds), `trace` and `trace-stats`
//! (activation traces and their statistics), `requant` (a GGUF requantized into a precision's
//! types) and `calibrate-kv` (the KV layout cost model). They drive `leanstream_tools::offline` and
//! `leanstream_tools::offline::calibrate_kv`; none of it runs in the daemon.

use super::*;

#[derive(Args)]
pub struct RequantArgs {
    /// The GGUF to requantize.
    model: PathBuf,
    /// f16, w8a8 or w4a8 (the targets of `--precision` at boot).
    #[arg(long)]
    precision: String,
    /// Where to write it (default: <model stem>.<precision>.gguf beside the model).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct CalibrateKvArgs {
    /// The model the table is for (its KV shape is benchmarked; the table carries its identity).
    #[arg(long)]
    model: PathBuf,
    /// Where to write the table (default: tables/kvcost-<model file stem>.bin).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct TextArgs {
    /// The text.
    #[arg(long)]
    file: PathBuf,
    /// Tokens to skip at the start of the text (keeps calibration text apart from test text).
    #[arg(long, default_value_t = 0)]
    skip_tokens: usize,
    /// Tokens to use after the skipped ones (whole windows).
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Window: the KV cache restarts every `ctx` tokens, as in perplexity.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
}

#[derive(Args)]
pub struct CalibrateArgs {
    /// GGUF file or llama2.c checkpoint.
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file for a llama2.c checkpoint (tok*.bin; default: one beside the model).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    text: TextArgs,
    /// Target sparsities, comma-separated, each in [0, 1).
    #[arg(long)]
    sparsity: String,
    /// Output (default: tables/<model file stem>.thresh).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct TraceArgs {
    /// GGUF file or llama2.c checkpoint.
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file for a llama2.c checkpoint (tok*.bin; default: one beside the model).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    text: TextArgs,
    /// Stages K of the partial residuals.
    #[arg(long, default_value_t = 8)]
    stages: usize,
    /// The stages split the neurons the oracle keeps at this sparsity (0: every neuron).
    #[arg(long, default_value_t = 0.8)]
    sparsity: f32,
    /// Thresholds table (default: tables/<model file stem>.thresh in the working directory,
    /// beside the model, or in the repository).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct TraceStatsArgs {
    /// The model the trace was recorded from.
    #[arg(long)]
    model: PathBuf,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    /// The trace file.
    #[arg(long)]
    trace: PathBuf,
    /// Sparsities for the oracle sets, comma-separated (each must be in the thresholds table).
    #[arg(long, default_value = "0.5,0.8")]
    sparsity: String,
    /// Thresholds table (default: tables/<model file stem>.thresh in the working directory,
    /// beside the model, or in the repository).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// Where to write the statistics (JSON).
    #[arg(long)]
    json: PathBuf,
}

/// The tokens `t` asks for: `skip_tokens` skipped, then whole windows of `ctx` up to `tokens`.
fn text_tokens(tok: &Tokenizer, t: &TextArgs) -> Result<Vec<u32>, String> {
    if t.ctx < 2 || t.tokens < t.ctx {
        return Err(format!(
            "--tokens {} must hold at least one window of --ctx {} (>= 2)",
            t.tokens, t.ctx
        ));
    }
    let text = std::fs::read(&t.file).map_err(|e| format!("{}: {e}", t.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let want = (t.skip_tokens + t.tokens).div_ceil(t.ctx);
    let all = tok.encode(text_prefix(&text, want + 1, t.ctx), false);
    if all.len() < t.skip_tokens + t.ctx {
        return Err(format!(
            "{} has {} tokens: none left after skipping {}",
            t.file.display(),
            all.len(),
            t.skip_tokens
        ));
    }
    let mut v = all[t.skip_tokens..].to_vec();
    v.truncate(t.tokens.min(v.len()) / t.ctx * t.ctx);
    Ok(v)
}

pub fn cmd_calibrate(a: CalibrateArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    let sparsities: Vec<f32> = a
        .sparsity
        .split(',')
        .map(leanstream::sparsity::parse_sparsity)
        .collect::<Result<_, _>>()?;
    let tokens = text_tokens(&tok, &a.text)?;
    let out = a.out.clone().unwrap_or_else(|| default_path(&a.model));
    let mut o = plain_options(a.threads);
    o.tap = Some(TapOptions::default());
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot_plain(&mut arenas, &file, &a.model, o)?;
    let (n_layers, hidden) = (engine.hyper.n_layers, engine.hyper.hidden_dim);
    if a.text.ctx > engine.context {
        return Err(format!(
            "--ctx {} is larger than the engine's context {}",
            a.text.ctx, engine.context
        ));
    }
    let started = Instant::now();
    let ctx = a.text.ctx;
    // Two passes: thresholds, then the dropped-neuron means under them.
    let (hist, levels) = leanstream_tools::offline::calibrate::calibrate(
        &mut engine,
        &tokens,
        ctx,
        &sparsities,
        &mut |done| {
            if done % ctx == 0 {
                eprintln!(
                    "calibrate: {done} / {} tokens over two passes ({:.1} tok/s)",
                    2 * tokens.len(),
                    done as f64 / started.elapsed().as_secs_f64()
                );
            }
        },
    )?;
    let table = ThresholdTable {
        n_layers: n_layers as u32,
        hidden: hidden as u32,
        calibration: format!(
            "{}: {} tokens after skipping {}, windows of {}",
            a.text.file.display(),
            tokens.len(),
            a.text.skip_tokens,
            a.text.ctx
        ),
        tokens: tokens.len() as u64,
        levels,
    };
    for lv in &table.levels {
        let mean = |score, t: &[f32]| {
            (0..n_layers)
                .map(|l| hist.fraction_below(l, score, t[l]))
                .sum::<f64>()
                / n_layers as f64
        };
        println!(
            "sparsity {:.2}: glu thresholds {:.3e}..{:.3e} (calibration drops {:.4}), gate thresholds {:.3e}..{:.3e} (drops {:.4})",
            lv.sparsity,
            lv.glu.iter().copied().fold(f32::MAX, f32::min),
            lv.glu.iter().copied().fold(0.0, f32::max),
            mean(Score::Glu, &lv.glu),
            lv.gate.iter().copied().fold(f32::MAX, f32::min),
            lv.gate.iter().copied().fold(0.0, f32::max),
            mean(Score::Gate, &lv.gate),
        );
    }
    table.save(&out, &file)?;
    println!(
        "wrote {} ({} levels, {} tokens)",
        out.display(),
        table.levels.len(),
        tokens.len()
    );
    Ok(())
}

pub fn cmd_trace(a: TraceArgs) -> Result<(), String> {
    use leanstream_tools::offline::trace::{TraceMeta, TraceWriter};
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    leanstream::sparsity::check_sparsity(a.sparsity)?;
    if a.stages == 0 {
        return Err("--stages must be at least 1".into());
    }
    let tokens = text_tokens(&tok, &a.text)?;
    let thresholds = if a.sparsity > 0.0 {
        let path = match a.thresholds.clone() {
            Some(p) => p,
            None => find_default(&a.model)?,
        };
        Some(ThresholdTable::load(&path, &file)?.thresholds(a.sparsity, Score::Glu)?)
    } else {
        None
    };
    let mut o = plain_options(a.threads);
    o.tap = Some(TapOptions {
        stages: a.stages,
        thresholds,
    });
    let meta = TraceMeta {
        model: a
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        identity: leanstream::tables::model_identity(&file),
        text: a.text.file.display().to_string(),
        skip_tokens: a.text.skip_tokens,
        ctx: a.text.ctx,
        sparsity: a.sparsity,
    };
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot_plain(&mut arenas, &file, &a.model, o)?;
    if a.text.ctx > engine.context {
        return Err(format!(
            "--ctx {} is larger than the engine's context {}",
            a.text.ctx, engine.context
        ));
    }
    let (mut w, per_token) =
        TraceWriter::create(&a.out, engine.tap().expect("tap"), tokens.len(), &meta)?;
    println!(
        "trace: {} tokens, {} bytes per token ({:.2} MiB), {:.1} MiB in all -> {}",
        tokens.len(),
        per_token,
        per_token as f64 / 1048576.0,
        (per_token * tokens.len() as u64) as f64 / 1048576.0,
        a.out.display()
    );
    let started = Instant::now();
    for (i, &t) in tokens.iter().enumerate() {
        let pos = i % a.text.ctx;
        engine.forward(t, pos);
        w.write(i, t, pos, engine.tap().expect("tap"))?;
        if (i + 1) % 64 == 0 {
            eprintln!(
                "trace: {} / {} tokens ({:.1} tok/s)",
                i + 1,
                tokens.len(),
                (i + 1) as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

pub fn cmd_trace_stats(a: TraceStatsArgs) -> Result<(), String> {
    use leanstream_tools::offline::trace::TraceReader;
    let file = ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let trace = TraceReader::open(&a.trace)?;
    let id = format!("{:016x}", leanstream::tables::model_identity(&file));
    if trace.meta("identity") != Some(id.as_str()) {
        return Err(format!(
            "{} was traced from another model (identity {}, {} is {id})",
            a.trace.display(),
            trace.meta("identity").unwrap_or("?"),
            a.model.display()
        ));
    }
    let path = match a.thresholds.clone() {
        Some(p) => p,
        None => find_default(&a.model)?,
    };
    let table = ThresholdTable::load(&path, &file)?;
    let sparsities: Vec<f32> = a
        .sparsity
        .split(',')
        .map(leanstream::sparsity::parse_sparsity)
        .collect::<Result<_, _>>()?;
    let total = (trace.layers - 1) * trace.tokens;
    let started = Instant::now();
    let json = leanstream_tools::offline::trace_stats::trace_stats(
        &trace,
        &file,
        &table,
        &sparsities,
        a.threads
            .map(threads_at_least_one)
            .unwrap_or(leanstream::board::CPU_THREADS),
        &mut |done| {
            if done % 256 == 0 {
                eprintln!(
                    "trace-stats: {done} / {total} ({:.0} s)",
                    started.elapsed().as_secs_f64()
                );
            }
        },
    )?;
    std::fs::write(&a.json, json).map_err(|e| format!("{}: {e}", a.json.display()))?;
    println!("wrote {}", a.json.display());
    Ok(())
}

pub fn cmd_requant(a: RequantArgs) -> Result<(), String> {
    let precision = Precision::parse(&a.precision)?;
    let out = a.out.unwrap_or_else(|| {
        let stem = a.model.file_stem().unwrap_or_default().to_string_lossy();
        a.model.with_file_name(format!("{stem}.{precision}.gguf"))
    });
    let report = leanstream_tools::offline::requant::requant(&a.model, precision, &out)?;
    eprintln!(
        "requant: {} -> {} at {precision}:\n{report}",
        a.model.display(),
        out.display()
    );
    println!("{}", out.display());
    Ok(())
}

pub fn cmd_calibrate_kv(a: CalibrateKvArgs) -> Result<(), String> {
    use leanstream::kv::{self, Layout, Shape};
    let file = ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let h = file
        .hyper()
        .map_err(|e| format!("{}: {e}", a.model.display()))?;
    if h.head_dim % 32 != 0 || h.head_dim > kv::MAX_HEAD_DIM {
        return Err(format!(
            "head_dim {} has no int8 KV cache (needs a multiple of 32, at most {})",
            h.head_dim,
            kv::MAX_HEAD_DIM
        ));
    }
    let shape = Shape {
        n_layers: h.n_layers,
        kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        context: 4096,
    };
    let (model, points) =
        leanstream_tools::offline::calibrate_kv::calibrate(shape, &[64, 256, 1024, 4096]);
    println!("bandwidth: {:.2} GB/s", model.bandwidth / 1e9);
    println!(
        "| layout | tokens | measured us | model us | bytes | ops |\n|---|---|---|---|---|---|"
    );
    let one = Shape {
        n_layers: 1,
        ..shape
    };
    for p in &points {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
            p.layout.name(),
            p.tokens,
            p.seconds * 1e6,
            model.cost(p.layout, &one, p.tokens) * 1e6,
            p.bytes,
            p.ops
        );
    }
    println!(
        "alpha1 = {:.4}, alpha2 = {:.3e} s/op; margin {}, persist {} tokens",
        model.alpha1, model.alpha2, model.margin, model.persist
    );
    let choice: Vec<String> = [1, 64, 256, 512, 1024, 4096]
        .iter()
        .map(|&t| {
            let b = model.best(&one, t);
            let gain = 1.0 - model.cost(b, &one, t) / model.cost(Layout::TokenMajor, &one, t);
            format!("{t}: {} ({:.1}% under token-major)", b.name(), gain * 100.0)
        })
        .collect();
    println!("best layout by length: {}", choice.join(", "));
    let out = a.out.unwrap_or_else(|| {
        let stem = a
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        PathBuf::from(format!("tables/kvcost-{stem}.bin"))
    });
    let id = leanstream::tables::model_identity(&file);
    leanstream::tables::write(&out, kv::TABLE_KIND, kv::TABLE_VERSION, id, &model)
        .map_err(|e| e.to_string())?;
    println!("wrote {}", out.display());
    Ok(())
}
