//! `leanstream`: the offline CLI. generate, perplexity, inspect and bench on the CPU backend.

use clap::{Args, Parser, Subcommand};
use leanstream::engine::generate::{generate, GenerateParams, GenerateStats};
use leanstream::engine::perplexity::perplexity;
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::{Arenas, Engine, EngineOptions};
use leanstream::load::open_model;
use leanstream::model::ModelFile;
use leanstream::sparsity::cli::SparsityArgs;
use leanstream::sparsity::thresholds::{default_path, ThresholdTable};
use leanstream::sparsity::trace::TapOptions;
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
use leanstream::tokenizer::chat::{ChatFormat, ChatMessage};
use leanstream::tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "leanstream",
    version,
    about = "LeanStream offline tools: run, measure and inspect models on the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text after a prompt; text on stdout, one stats line on stderr.
    Generate(GenerateArgs),
    /// Perplexity of a text file over non-overlapping windows (no BOS); last line `ppl = X`.
    Perplexity(PerplexityArgs),
    /// Architecture, shapes, tensor types and bytes per part of a model file.
    Inspect { path: PathBuf },
    /// Prefill and decode speed; writes JSON and a Markdown table.
    Bench(BenchArgs),
    /// Per-layer FFN activation thresholds for target sparsities, from the dense model over a
    /// text; written to a tables/ file.
    Calibrate(CalibrateArgs),
    /// Record per layer and token the FFN's residual, input, staged partial residuals and
    /// neuron activations (safetensors).
    Trace(TraceArgs),
    /// Statistics of a trace: magnitude shares, active-set overlap, one-shot and staged recall.
    TraceStats(TraceStatsArgs),
    /// Ask a running leanstreamd; the answer streams as it comes.
    Ask(AskArgs),
    /// An interactive chat with a running leanstreamd (/exit to leave, /reset to forget).
    Chat(ClientArgs),
    /// Health and metrics of a running leanstreamd.
    Status {
        /// The daemon's socket (default: the board's).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ClientArgs {
    /// The daemon's socket (default: the board's).
    #[arg(long)]
    socket: Option<PathBuf>,
    #[arg(long)]
    max_tokens: Option<u32>,
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<u32>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Args)]
struct AskArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Send the prompt as a chat message (the model's chat template) instead of raw text.
    #[arg(long)]
    chat: bool,
    prompt: String,
}

impl ClientArgs {
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(leanstream::board::SOCKET_PATH))
    }
    fn options(&self, chat: bool) -> leanstream::client::AskOptions {
        leanstream::client::AskOptions {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            chat,
        }
    }
}

#[derive(Args)]
struct ModelArgs {
    /// GGUF file or llama2.c checkpoint.
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file (llama2.c tok*.bin, or a GGUF whose vocabulary to use).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    sparsity: SparsityArgs,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt; "" starts from BOS.
    #[arg(long, allow_hyphen_values = true)]
    prompt: String,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// 0 keeps every token.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this text is generated (may repeat, up to 4).
    #[arg(long)]
    stop: Vec<String>,
}

#[derive(Args)]
struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score.
    #[arg(long)]
    file: PathBuf,
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Number of windows (default: all).
    #[arg(long, default_value_t = 0)]
    chunks: usize,
    /// Also write every configuration's result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct TextArgs {
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
struct CalibrateArgs {
    /// GGUF file or llama2.c checkpoint.
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    tokenizer: Option<PathBuf>,
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
struct TraceArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    tokenizer: Option<PathBuf>,
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
    /// Thresholds table (default: tables/<model file stem>.thresh).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct TraceStatsArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    threads: Option<usize>,
    /// The trace file.
    #[arg(long)]
    trace: PathBuf,
    /// Sparsities for the oracle sets, comma-separated (each must be in the thresholds table).
    #[arg(long, default_value = "0.5,0.8")]
    sparsity: String,
    /// Thresholds table (default: tables/<model file stem>.thresh).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// Where to write the statistics (JSON).
    #[arg(long)]
    json: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Where to write the JSON result.
    #[arg(long, default_value = "bench.json")]
    json: PathBuf,
    /// Where to write the Markdown table.
    #[arg(long, default_value = "bench.md")]
    markdown: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => cmd_generate(a),
        Command::Perplexity(a) => cmd_perplexity(a),
        Command::Inspect { path } => cmd_inspect(&path),
        Command::Bench(a) => cmd_bench(a),
        Command::Calibrate(a) => cmd_calibrate(a),
        Command::Trace(a) => cmd_trace(a),
        Command::TraceStats(a) => cmd_trace_stats(a),
        Command::Ask(a) => cmd_ask(a),
        Command::Chat(a) => {
            let stdin = std::io::stdin();
            leanstream::client::chat_repl(
                &a.socket(),
                &a.options(true),
                &mut stdin.lock(),
                &mut std::io::stdout(),
            )
            .map_err(|e| e.to_string())
        }
        Command::Status { socket } => {
            let socket = socket.unwrap_or_else(|| PathBuf::from(leanstream::board::SOCKET_PATH));
            leanstream::client::status(&socket, &mut std::io::stdout()).map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_ask(a: AskArgs) -> Result<(), String> {
    let mut out = std::io::stdout();
    let summary = leanstream::client::ask(
        &a.client.socket(),
        &a.prompt,
        &a.client.options(a.chat),
        &mut out,
    )
    .map_err(|e| e.to_string())?;
    println!();
    eprintln!(
        "finish: {} | completion tokens: {}",
        summary.finish_reason.as_deref().unwrap_or("?"),
        summary.completion_tokens
    );
    Ok(())
}

fn options(threads: Option<usize>, ffn: FfnOptions) -> EngineOptions {
    let mut o = EngineOptions {
        ffn,
        ..Default::default()
    };
    if let Some(t) = threads {
        o.threads = t;
    }
    o
}

fn boot<'a>(arenas: &'a mut Arenas, file: &ModelFile, m: &ModelArgs) -> Result<Engine<'a>, String> {
    let ffn = m.sparsity.single(&m.model, file)?;
    boot_with(arenas, file, &m.model, options(m.threads, ffn))
}

fn boot_with<'a>(
    arenas: &'a mut Arenas,
    file: &ModelFile,
    path: &Path,
    o: EngineOptions,
) -> Result<Engine<'a>, String> {
    Engine::boot(arenas, file, o).map_err(|e| format!("{}: {e}", path.display()))
}

/// The prompt's tokens: plain text or the chat template, BOS as the model wants it.
fn prompt_tokens(
    tok: &Tokenizer,
    file: &ModelFile,
    prompt: &str,
    chat: bool,
) -> Result<Vec<u32>, String> {
    if chat {
        let template = match file {
            ModelFile::Gguf(g) => g.get_str("tokenizer.chat_template"),
            ModelFile::Llama2c(_) => None,
        };
        let format = ChatFormat::detect(template).map_err(|e| e.to_string())?;
        let text = format.render(
            &[ChatMessage {
                role: "user",
                content: prompt,
            }],
            true,
        );
        return Ok(tok.encode_with_special(&text, tok.add_bos_default(), true));
    }
    // An empty prompt starts from BOS.
    let add_bos = tok.add_bos_default() || prompt.is_empty();
    Ok(tok.encode(prompt, add_bos))
}

fn cmd_generate(a: GenerateArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model.model, a.model.tokenizer.as_deref())?;
    let sampler_cfg = SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    sampler_cfg.check()?;
    let prompt = prompt_tokens(&tok, &file, &a.prompt, a.chat)?;
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot(&mut arenas, &file, &a.model)?;
    drop(file);
    let idx = engine.take_sample_buffer().expect("fresh engine");
    let mut sampler = Sampler::new(sampler_cfg, idx);
    let stops: Vec<&str> = a.stop.iter().map(String::as_str).collect();
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        stop: &stops,
        deadline: None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stats = generate(
        &mut engine,
        &mut sampler,
        &tok,
        &prompt,
        &params,
        &mut |bytes| out.write_all(bytes).and_then(|_| out.flush()).is_ok(),
    )
    .map_err(|e| e.to_string())?;
    let _ = writeln!(out);
    eprintln!("{}", stats_line(&stats, engine.threads()));
    Ok(())
}

fn stats_line(s: &GenerateStats, threads: usize) -> String {
    format!(
        "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | finish: {} | threads: {threads}",
        s.prompt_tokens,
        s.prefill_tok_per_s(),
        s.generated_tokens,
        s.decode_tok_per_s(),
        s.finish.as_str()
    )
}

/// Perplexity of every configuration the sparsity options name, in one process: dense on its
/// own engine, the sparse ones on one engine with bundles (options switched between runs).
fn cmd_perplexity(a: PerplexityArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model.model, a.model.tokenizer.as_deref())?;
    let configs = a.model.sparsity.configs(&a.model.model, &file)?;
    let text = std::fs::read(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let text = text_prefix(&text, a.chunks, a.ctx);
    let tokens = tok.encode(text, false);
    let mut results = Vec::new();
    let mut last = 0.0;
    for group in [false, true] {
        let mine: Vec<&FfnOptions> = configs
            .iter()
            .filter(|c| (c.mode != FfnMode::Dense) == group)
            .collect();
        let Some(first) = mine.first() else {
            continue;
        };
        let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
        let mut engine = boot_with(
            &mut arenas,
            &file,
            &a.model.model,
            options(a.model.threads, (*first).clone()),
        )?;
        for c in mine {
            engine.set_ffn(c).map_err(|e| e.to_string())?;
            engine.take_ffn_counts();
            let label = c.label();
            let started = Instant::now();
            let r = perplexity(&mut engine, &tokens, a.ctx, a.chunks, &mut |w, p| {
                eprintln!("{label}: window {}: ppl {p:.4}", w + 1);
            })?;
            let secs = started.elapsed().as_secs_f64();
            let measured = match engine.take_ffn_counts() {
                Some((kept, seen)) if seen > 0 => 1.0 - kept as f64 / seen as f64,
                _ => 0.0,
            };
            eprintln!(
                "{label}: {} windows of {} tokens, {} scored, {:.1} tok/s, neurons dropped {:.4}",
                r.windows,
                a.ctx,
                r.scored_tokens,
                r.scored_tokens as f64 / secs,
                measured
            );
            if configs.len() > 1 {
                println!("{label}: ppl = {:.4}", r.ppl);
            }
            results.push(format!(
                "    {{\"config\": \"{label}\", \"mode\": \"{}\", \"score\": \"{}\", \"sparsity\": {}, \"ppl\": {:.6}, \"dropped\": {:.6}, \"windows\": {}, \"scored_tokens\": {}, \"per_window\": [{}]}}",
                c.mode.name(),
                if c.mode == FfnMode::Dense { "-" } else { c.score.name() },
                c.sparsity,
                r.ppl,
                measured,
                r.windows,
                r.scored_tokens,
                r.per_window.iter().map(|p| format!("{p:.6}")).collect::<Vec<_>>().join(", ")
            ));
            last = r.ppl;
            write_ppl_json(&a, &results)?;
        }
    }
    println!("ppl = {last:.4}");
    Ok(())
}

/// Written after every configuration, so a long sweep that is stopped keeps what it measured.
fn write_ppl_json(a: &PerplexityArgs, results: &[String]) -> Result<(), String> {
    if let Some(path) = &a.json {
        let name = a
            .model
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let json = format!(
            "{{\n  \"model\": {name:?},\n  \"file\": {:?},\n  \"ctx\": {},\n  \"results\": [\n{}\n  ]\n}}\n",
            a.file.display().to_string(),
            a.ctx,
            results.join(",\n")
        );
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
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

fn cmd_calibrate(a: CalibrateArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    let sparsities: Vec<f32> = a
        .sparsity
        .split(',')
        .map(leanstream::sparsity::parse_sparsity)
        .collect::<Result<_, _>>()?;
    let tokens = text_tokens(&tok, &a.text)?;
    let out = a.out.clone().unwrap_or_else(|| default_path(&a.model));
    let mut o = options(a.threads, FfnOptions::default());
    o.tap = Some(TapOptions::default());
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot_with(&mut arenas, &file, &a.model, o)?;
    let (n_layers, hidden) = (engine.hyper.n_layers, engine.hyper.hidden_dim);
    if a.text.ctx > engine.context {
        return Err(format!(
            "--ctx {} is larger than the engine's context {}",
            a.text.ctx, engine.context
        ));
    }
    let started = Instant::now();
    let ctx = a.text.ctx;
    let hist =
        leanstream::sparsity::thresholds::calibrate(&mut engine, &tokens, ctx, &mut |done| {
            if done % ctx == 0 {
                eprintln!(
                    "calibrate: {done} / {} tokens ({:.1} tok/s)",
                    tokens.len(),
                    done as f64 / started.elapsed().as_secs_f64()
                );
            }
        })?;
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
        levels: sparsities.iter().map(|&s| hist.level(s)).collect(),
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

fn cmd_trace(a: TraceArgs) -> Result<(), String> {
    use leanstream::sparsity::trace::{TraceMeta, TraceWriter};
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    leanstream::sparsity::check_sparsity(a.sparsity)?;
    if a.stages == 0 {
        return Err("--stages must be at least 1".into());
    }
    let tokens = text_tokens(&tok, &a.text)?;
    let thresholds = if a.sparsity > 0.0 {
        let path = a
            .thresholds
            .clone()
            .unwrap_or_else(|| default_path(&a.model));
        Some(ThresholdTable::load(&path, &file)?.thresholds(a.sparsity, Score::Glu)?)
    } else {
        None
    };
    let mut o = options(a.threads, FfnOptions::default());
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
    let mut engine = boot_with(&mut arenas, &file, &a.model, o)?;
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

fn cmd_trace_stats(a: TraceStatsArgs) -> Result<(), String> {
    use leanstream::sparsity::trace::TraceReader;
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
    let path = a
        .thresholds
        .clone()
        .unwrap_or_else(|| default_path(&a.model));
    let table = ThresholdTable::load(&path, &file)?;
    let sparsities: Vec<f32> = a
        .sparsity
        .split(',')
        .map(leanstream::sparsity::parse_sparsity)
        .collect::<Result<_, _>>()?;
    let total = (trace.layers - 1) * trace.tokens;
    let started = Instant::now();
    let json = leanstream::sparsity::stats::trace_stats(
        &trace,
        &file,
        &table,
        &sparsities,
        a.threads.unwrap_or(leanstream::board::CPU_THREADS),
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

/// Enough of the text for `chunks` windows (whole lines, with a wide margin), so a long file is
/// not tokenized in full when only its start is scored.
fn text_prefix(text: &str, chunks: usize, ctx: usize) -> &str {
    if chunks == 0 {
        return text;
    }
    let want = chunks.saturating_mul(ctx).saturating_mul(16).max(4096);
    if want >= text.len() {
        return text;
    }
    match text[..want].rfind('\n') {
        Some(i) => &text[..=i],
        None => text,
    }
}

fn cmd_inspect(path: &Path) -> Result<(), String> {
    let file = ModelFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let h = file
        .hyper()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("file: {}", path.display());
    println!(
        "format: {}",
        match &file {
            ModelFile::Gguf(g) => format!("GGUF v{} (alignment {})", g.version, g.alignment),
            ModelFile::Llama2c(_) => "llama2.c checkpoint (f32)".to_string(),
        }
    );
    println!("architecture: {:?}", h.arch);
    println!(
        "layers {} | dim {} | ffn {} | heads {} / kv heads {} | head_dim {} | vocab {} | context {}",
        h.n_layers, h.dim, h.hidden_dim, h.n_heads, h.n_kv_heads, h.head_dim, h.vocab_size, h.ctx_train
    );
    println!(
        "rope {:?} base {} | rms eps {:e} | output {} | q/k/v bias {}",
        h.rope_style,
        h.rope_base,
        h.norm_eps,
        if h.tied_output {
            "tied to embeddings"
        } else {
            "own tensor"
        },
        h.qkv_bias
    );
    let names: Vec<String> = match &file {
        ModelFile::Gguf(g) => g.tensors.iter().map(|t| t.name.clone()).collect(),
        ModelFile::Llama2c(_) => ModelFile::expected_tensors(&h)
            .into_iter()
            .map(|(n, _, _)| n)
            .collect(),
    };
    let mut parts: [(&str, usize); 4] = [
        ("embeddings + output", 0),
        ("attention", 0),
        ("ffn", 0),
        ("norms", 0),
    ];
    let mut by_type: Vec<(String, usize, usize)> = Vec::new();
    println!(
        "\n{:<28} {:>6} {:>16} {:>12}",
        "tensor", "type", "shape", "bytes"
    );
    for name in &names {
        let t = file.tensor(name).map_err(|e| e.to_string())?;
        println!(
            "{:<28} {:>6} {:>16} {:>12}",
            name,
            t.ty.name(),
            format!("{}x{}", t.cols, t.rows),
            t.data.len()
        );
        let part =
            if name.contains("ffn_gate") || name.contains("ffn_up") || name.contains("ffn_down") {
                2
            } else if name.contains("attn_q")
                || name.contains("attn_k")
                || name.contains("attn_v")
                || name.contains("attn_output")
            {
                1
            } else if name.contains("norm") {
                3
            } else {
                0
            };
        parts[part].1 += t.data.len();
        match by_type.iter_mut().find(|(n, _, _)| n == t.ty.name()) {
            Some(e) => {
                e.1 += 1;
                e.2 += t.data.len();
            }
            None => by_type.push((t.ty.name().to_string(), 1, t.data.len())),
        }
    }
    println!("\nbytes per part:");
    for (name, bytes) in parts {
        println!(
            "  {:<22} {:>12} ({:.1} MiB)",
            name,
            bytes,
            bytes as f64 / 1048576.0
        );
    }
    println!("tensor types:");
    for (ty, n, bytes) in by_type {
        println!("  {:<6} {:>4} tensors {:>12} bytes", ty, n, bytes);
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prefill and decode speed of every configuration the sparsity options name, side by side in
/// one process: each configuration has its own engine, and the repetitions alternate between
/// them so that a busy moment of the machine touches all of them alike.
fn cmd_bench(a: BenchArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model.model, a.model.tokenizer.as_deref())?;
    let configs = a.model.sparsity.configs(&a.model.model, &file)?;
    let name = a
        .model
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A fixed, ordinary English prompt, repeated to the asked length (speed does not depend on it).
    let seed_text = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea, there lived a curious child who loved to read about the stars. ";
    let mut prompt = tok.encode(
        &seed_text.repeat(1 + a.prompt_tokens / 8),
        tok.add_bos_default(),
    );
    prompt.truncate(a.prompt_tokens.max(1));
    let mut arenas: Vec<Arenas> = configs
        .iter()
        .map(|_| Arenas::from_board().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut engines: Vec<Engine> = arenas
        .iter_mut()
        .zip(&configs)
        .map(|(ar, c)| {
            boot_with(
                ar,
                &file,
                &a.model.model,
                options(a.model.threads, c.clone()),
            )
        })
        .collect::<Result<_, _>>()?;
    drop(file);
    if prompt.len() + a.gen_tokens > engines[0].context {
        return Err(format!(
            "prompt + gen tokens ({}) exceed the context ({})",
            prompt.len() + a.gen_tokens,
            engines[0].context
        ));
    }
    let mut samplers: Vec<Sampler> = engines
        .iter_mut()
        .map(|e| {
            Sampler::new(
                SamplerConfig::default(),
                e.take_sample_buffer().expect("fresh engine"),
            )
        })
        .collect();
    // Greedy decoding may hit end-of-text early; decode a fixed count by forwarding sampled
    // tokens directly.
    let mut prefill = vec![Vec::new(); configs.len()];
    let mut decode = vec![Vec::new(); configs.len()];
    let mut dropped = vec![0.0; configs.len()];
    for _ in 0..a.reps.max(1) {
        for (i, (engine, sampler)) in engines.iter_mut().zip(samplers.iter_mut()).enumerate() {
            let t0 = Instant::now();
            let mut logits_token = 0;
            for (pos, &t) in prompt.iter().enumerate() {
                logits_token = sampler.sample(engine.forward(t, pos));
            }
            let t1 = Instant::now();
            engine.take_ffn_counts();
            let mut token = logits_token;
            for j in 0..a.gen_tokens {
                token = sampler.sample(engine.forward(token, prompt.len() + j));
            }
            let t2 = Instant::now();
            if let Some((kept, seen)) = engine.take_ffn_counts() {
                dropped[i] = 1.0 - kept as f64 / seen.max(1) as f64;
            }
            prefill[i].push(prompt.len() as f64 / (t1 - t0).as_secs_f64());
            decode[i].push(a.gen_tokens as f64 / (t2 - t1).as_secs_f64());
        }
    }
    let threads = engines[0].threads();
    let p: Vec<f64> = prefill.into_iter().map(median).collect();
    let d: Vec<f64> = decode.into_iter().map(median).collect();
    let base = configs
        .iter()
        .position(|c| c.mode == FfnMode::Dense)
        .map(|i| d[i]);
    let mut rows = Vec::new();
    let mut md = String::from("| model | backend | threads | ffn | neurons dropped | prompt tokens | gen tokens | prefill tok/s | decode tok/s | decode vs dense |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (i, c) in configs.iter().enumerate() {
        let ratio = base.map(|b| d[i] / b);
        rows.push(format!(
            "    {{\"ffn\": \"{}\", \"neurons_dropped\": {:.4}, \"prefill_tok_per_s\": {:.2}, \"decode_tok_per_s\": {:.2}, \"decode_vs_dense\": {}}}",
            c.label(),
            dropped[i],
            p[i],
            d[i],
            ratio.map(|r| format!("{r:.3}")).unwrap_or_else(|| "null".into())
        ));
        md.push_str(&format!(
            "| {name} | cpu | {threads} | {} | {:.2} | {} | {} | {:.1} | {:.1} | {} |\n",
            c.label(),
            dropped[i],
            prompt.len(),
            a.gen_tokens,
            p[i],
            d[i],
            ratio
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into())
        ));
    }
    let json = format!(
        "{{\n  \"model\": {:?},\n  \"backend\": \"cpu\",\n  \"threads\": {threads},\n  \"board\": {:?},\n  \"prompt_tokens\": {},\n  \"gen_tokens\": {},\n  \"reps\": {},\n  \"prefill_tok_per_s\": {:.2},\n  \"decode_tok_per_s\": {:.2},\n  \"configs\": [\n{}\n  ]\n}}\n",
        name,
        leanstream::board::NAME,
        prompt.len(),
        a.gen_tokens,
        a.reps,
        p[0],
        d[0],
        rows.join(",\n")
    );
    std::fs::write(&a.json, &json).map_err(|e| format!("{}: {e}", a.json.display()))?;
    std::fs::write(&a.markdown, &md).map_err(|e| format!("{}: {e}", a.markdown.display()))?;
    print!("{md}");
    Ok(())
}
