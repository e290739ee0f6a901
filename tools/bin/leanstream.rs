//! `leanstream`: the offline CLI. generate, perplexity, inspect, tokenize and bench on the CPU or
//! CUDA backend, and a client of a running leanstreamd.

mod tokenize;

mod cmd_bench;
mod cmd_board;
mod cmd_offline;

use clap::{Args, Parser, Subcommand};
use leanstream::board::MemoryModel;
use leanstream::engine::any::{parse_memory, AnyEngine, Backend};
use leanstream::engine::cuda_options::{CudaOptions, DependentLaunch, InBlockNorm, ProductKernels};
use leanstream::engine::generate::{generate, GenerateParams, GenerateStats};
use leanstream::engine::perplexity::perplexity;
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::tap::TapOptions;
use leanstream::engine::{Arenas, Decoder, Engine, EngineOptions};
use leanstream::load::open_model;
use leanstream::model::ModelFile;
use leanstream::quant::{Packing, Precision};
use leanstream::sparsity::cli::SparsityArgs;
use leanstream::sparsity::thresholds::{default_path, find_default, ThresholdTable};
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
    about = "LeanStream tools: run, measure and inspect models on the CPU or an NVIDIA GPU (--backend cuda), tokenize text, and talk to a running leanstreamd"
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
    Inspect {
        /// The model file (GGUF or llama2.c checkpoint).
        path: PathBuf,
    },
    /// Every byte the daemon owns on this image's board (budgets, owners, limits); with
    /// --model, what the model needs of each arena at each precision and whether it boots.
    Board(cmd_board::BoardArgs),
    /// The token ids a text becomes (`id<TAB>'piece'` per line, or `--ids`), or with `--decode`
    /// the text of ids.
    Tokenize(tokenize::TokenizeArgs),
    /// Prefill and decode speed; writes JSON and a Markdown table.
    Bench(cmd_bench::BenchArgs),
    /// Requantize a GGUF offline into a precision's GGML types (Q8_0 / Q4_0 / F16), so that boot
    /// imports it as it is; prints what it did and the requantization error.
    Requant(cmd_offline::RequantArgs),
    /// Fit the int8 KV cache's layout cost model on this board (a short microbenchmark) and
    /// write it as a `kvcost` table for the model.
    CalibrateKv(cmd_offline::CalibrateKvArgs),
    /// Per-layer FFN activation thresholds for target sparsities, from the dense model over a
    /// text; written to a tables/ file.
    Calibrate(cmd_offline::CalibrateArgs),
    /// Record per layer and token the FFN's residual, input, staged partial residuals and
    /// neuron activations (safetensors).
    Trace(cmd_offline::TraceArgs),
    /// Statistics of a trace: magnitude shares, active-set overlap, one-shot and staged recall.
    TraceStats(cmd_offline::TraceStatsArgs),
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
    /// Most tokens to generate per answer (default: the daemon's).
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature; 0 is greedy (default: the daemon's).
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens only; 0 keeps every token (default: the daemon's).
    #[arg(long)]
    top_k: Option<u32>,
    /// Sample among the most likely tokens whose probabilities add up to P (default: the
    /// daemon's).
    #[arg(long)]
    top_p: Option<f32>,
    /// Random seed of the sampler, for repeatable answers (default: a fresh one per request).
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
    /// The prompt (or, with --chat, the user's message).
    prompt: String,
}

impl ClientArgs {
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(leanstream::board::SOCKET_PATH))
    }
    fn options(&self, chat: bool) -> leanstream_tools::client::AskOptions {
        leanstream_tools::client::AskOptions {
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
    /// Where to run: cpu, or cuda (an NVIDIA GPU and its driver).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// CUDA weights in `unified` (pinned host memory the GPU reads, as on a Jetson) or
    /// `discrete` (device) memory; default: the board's memory_model.
    #[arg(long)]
    memory: Option<String>,
    /// CUDA: launch every kernel instead of replaying one captured graph per token.
    #[arg(long)]
    no_graph: bool,
    #[command(flatten)]
    low: LowBitArgs,
    #[command(flatten)]
    sparsity: SparsityArgs,
}

#[derive(Args, Clone)]
struct LowBitArgs {
    /// native (the file's own types, f32 KV), f16, w8a8 or w4a8 (int8 KV for the last two).
    #[arg(long, default_value = "native", value_parser = Precision::parse)]
    precision: Precision,
    /// int4 packing (w4a8, and Q4_0 matrices at native): contiguous, interleaved or swizzled
    /// (bit-identical results).
    #[arg(long, default_value = "swizzled", value_parser = Packing::parse)]
    packing: Packing,
    /// KV layout policy for the int8 cache: adaptive, token-major or head-tiles.
    #[arg(long, default_value = "adaptive")]
    kv_layout: String,
    /// A kvcost table from `leanstream calibrate-kv` (default: built-in constants).
    #[arg(long)]
    kv_cost: Option<PathBuf>,
    /// Ablation: dequantize each weight group to f32 before the dot product (w8a8/w4a8).
    #[arg(long)]
    no_deferred_dequant: bool,
    /// Ablation: the AVX2 dot product where the CPU has VNNI (w8a8/w4a8).
    #[arg(long)]
    no_vnni: bool,
    /// Ablation: the eight-row (ymm) kernels where the CPU has AVX-512 VNNI, not the
    /// sixteen-row ones.
    #[arg(long)]
    no_avx512: bool,
}

impl LowBitArgs {
    /// Sets the kernel switches (ablations) these options name.
    fn set_kernels(&self) {
        leanstream::backend::cpu::lowbit::set_deferred_dequant(!self.no_deferred_dequant);
        leanstream::backend::cpu::lowbit::set_vnni(!self.no_vnni);
        leanstream::backend::cpu::lowbit::set_avx512(!self.no_avx512);
    }
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
    /// Most tokens to generate (fewer if the context ends first; 0 only encodes the prompt).
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// 0 keeps every token.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely tokens whose probabilities add up to P (1 keeps every
    /// token).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Random seed of the sampler.
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
    /// Window length in tokens (the KV cache restarts for each window).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Number of windows (default: all).
    #[arg(long, default_value_t = 0)]
    chunks: usize,
    /// Also write every configuration's result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => cmd_generate(a),
        Command::Perplexity(a) => cmd_perplexity(a),
        Command::Inspect { path } => cmd_inspect(&path),
        Command::Board(a) => cmd_board::run(a),
        Command::Tokenize(a) => tokenize::cmd_tokenize(a).map(|text| {
            // A reader that stops early (`| head`) ends the listing quietly.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }),
        Command::Bench(a) => cmd_bench::cmd_bench(a),
        Command::Requant(a) => cmd_offline::cmd_requant(a),
        Command::CalibrateKv(a) => cmd_offline::cmd_calibrate_kv(a),
        Command::Calibrate(a) => cmd_offline::cmd_calibrate(a),
        Command::Trace(a) => cmd_offline::cmd_trace(a),
        Command::TraceStats(a) => cmd_offline::cmd_trace_stats(a),
        Command::Ask(a) => cmd_ask(a),
        Command::Chat(a) => {
            let stdin = std::io::stdin();
            leanstream_tools::client::chat_repl(
                &a.socket(),
                &a.options(true),
                &mut stdin.lock(),
                &mut std::io::stdout(),
            )
            .map_err(|e| e.to_string())
        }
        Command::Status { socket } => {
            let socket = socket.unwrap_or_else(|| PathBuf::from(leanstream::board::SOCKET_PATH));
            leanstream_tools::client::status(&socket, &mut std::io::stdout())
                .map_err(|e| e.to_string())
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
    let summary = leanstream_tools::client::ask(
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

fn options(
    m: &ModelArgs,
    low: &LowBitArgs,
    file: &ModelFile,
    ffn: FfnOptions,
) -> Result<EngineOptions, String> {
    let mut o = EngineOptions {
        ffn,
        ..EngineOptions::default()
    };
    if let Some(t) = m.threads {
        o.threads = threads_at_least_one(t);
    }
    o.precision = low.precision;
    o.packing = low.packing;
    o.kv_policy = leanstream::kv::policy_from(file, low.kv_cost.as_deref(), &low.kv_layout)?;
    low.set_kernels();
    Ok(o)
}

fn cuda_options(m: &ModelArgs) -> Result<CudaOptions, String> {
    let mut o = CudaOptions {
        graph: !m.no_graph,
        ..CudaOptions::default()
    };
    if let Some(mem) = &m.memory {
        o.memory = parse_memory(mem)?;
    }
    Ok(o)
}

fn boot<'a>(
    arenas: &'a mut Arenas,
    file: &ModelFile,
    m: &ModelArgs,
) -> Result<AnyEngine<'a>, String> {
    let ffn = m.sparsity.single(&m.model, file)?;
    boot_with(arenas, file, m, &m.low, ffn, true)
}

/// Boots on `m`'s backend at `low`'s precision with the FFN `ffn` (sparse modes: CPU only);
/// says on stderr what the conversion did (unless native).
fn boot_with<'a>(
    arenas: &'a mut Arenas,
    file: &ModelFile,
    m: &ModelArgs,
    low: &LowBitArgs,
    ffn: FfnOptions,
    report: bool,
) -> Result<AnyEngine<'a>, String> {
    let backend = Backend::parse(&m.backend)?;
    let cuda = cuda_options(m)?;
    let e =
        AnyEngine::boot(arenas, file, backend, options(m, low, file, ffn)?, cuda).map_err(|e| {
            match e {
                leanstream::engine::EngineError::Gpu(_) => e.to_string(),
                leanstream::engine::EngineError::Options(_) if backend == Backend::Cuda => {
                    e.to_string()
                }
                _ => format!("{}: {e}", m.model.display()),
            }
        })?;
    if report && low.precision != Precision::Native {
        match &e {
            AnyEngine::Cpu(cpu) => eprintln!("{}", precision_line(cpu, low)),
            // The GPU image's types follow the same roles (README, The CUDA backend).
            #[cfg(feature = "cuda")]
            AnyEngine::Cuda(c) => eprintln!(
                "precision {}: {} | {}",
                low.precision,
                c.conversions,
                e.describe()
            ),
        }
    }
    Ok(e)
}
/// Boots on the CPU backend (the low-bit and FFN configurations).
fn boot_cpu<'a>(
    arenas: &'a mut Arenas,
    file: &ModelFile,
    m: &ModelArgs,
    low: &LowBitArgs,
    ffn: FfnOptions,
    report: bool,
) -> Result<Engine<'a>, String> {
    let e = Engine::boot(arenas, file, options(m, low, file, ffn)?)
        .map_err(|e| format!("{}: {e}", m.model.display()))?;
    if report && low.precision != Precision::Native {
        eprintln!("{}", precision_line(&e, low));
    }
    Ok(e)
}

fn precision_line(e: &Engine, low: &LowBitArgs) -> String {
    format!(
        "precision {}{}: {} | KV cache {}",
        low.precision,
        if low.precision == Precision::W4a8 {
            format!(" ({})", low.packing.name())
        } else {
            String::new()
        },
        e.conversions,
        e.kv_description()
    )
}

/// Dense-FFN CPU options at the file's own precision (calibration and traces).
fn plain_options(threads: Option<usize>) -> EngineOptions {
    let mut o = EngineOptions::default();
    if let Some(t) = threads {
        o.threads = threads_at_least_one(t);
    }
    o
}

/// `--threads 0` runs one worker: said once on stderr rather than silently.
fn threads_at_least_one(t: usize) -> usize {
    static SAID: std::sync::Once = std::sync::Once::new();
    if t == 0 {
        SAID.call_once(|| eprintln!("note: --threads 0 runs 1 worker thread"));
    }
    t.max(1)
}

fn boot_plain<'a>(
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
        // Control tokens only from the template's markers: the prompt is plain text.
        let (_, ids) = tok.encode_chat(
            &format,
            &[ChatMessage {
                role: "user",
                content: prompt,
            }],
            true,
            tok.add_bos_default(),
        );
        return Ok(ids);
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
    // A prompt that leaves no room is refused by `generate` itself.
    let room = engine.decoder().context().saturating_sub(prompt.len());
    if a.max_tokens > room && room > 0 {
        eprintln!(
            "note: --max-tokens {} is past the context of {} tokens ({} of them the prompt): at most {room} are generated",
            a.max_tokens,
            engine.decoder().context(),
            prompt.len()
        );
    }
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
        engine.decoder(),
        &mut sampler,
        &tok,
        &prompt,
        &params,
        &mut |bytes| out.write_all(bytes).and_then(|_| out.flush()).is_ok(),
    )
    .map_err(|e| e.to_string())?;
    let _ = writeln!(out);
    eprintln!("{} | {}", stats_line(&stats), engine.describe());
    Ok(())
}

fn stats_line(s: &GenerateStats) -> String {
    // The prompt is run with the first step: with no step, there is no speed to report; with
    // one, no decode speed (the first token comes out of the prefill).
    if s.generated_tokens == 0 {
        return format!(
            "prefill: {} tokens, not run (no token generated) | decode: 0 tokens | finish: {}",
            s.prompt_tokens,
            s.finish.as_str()
        );
    }
    if s.generated_tokens == 1 {
        return format!(
            "prefill: {} tokens, {:.1} tok/s | decode: 1 token (from the prefill) | finish: {}",
            s.prompt_tokens,
            s.prefill_tok_per_s(),
            s.finish.as_str()
        );
    }
    format!(
        "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | finish: {}",
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
    if Backend::parse(&a.model.backend)? == Backend::Cuda
        && configs.iter().any(|c| c.mode != FfnMode::Dense)
    {
        return Err("the sparse FFN runs on the CPU backend only for now".into());
    }
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
            &a.model,
            &a.model.low,
            (*first).clone(),
            true,
        )?;
        for c in mine {
            if let Some(e) = engine.cpu() {
                e.set_ffn(c).map_err(|e| e.to_string())?;
                e.take_ffn_counts();
            }
            let label = c.label();
            let started = Instant::now();
            let r = perplexity(engine.decoder(), &tokens, a.ctx, a.chunks, &mut |w, p| {
                eprintln!("{label}: window {}: ppl {p:.4}", w + 1);
            })?;
            let secs = started.elapsed().as_secs_f64();
            let counts = engine.cpu().and_then(|e| e.take_ffn_counts());
            let measured = match counts {
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
    // The report is built whole, then written once: a reader that stops early (`| head`) ends
    // the command quietly instead of a panic in the middle of a line.
    let mut report = String::new();
    macro_rules! out {
        ($($t:tt)*) => {{
            use std::fmt::Write as _;
            // Writing into a String cannot fail.
            let _ = writeln!(report, $($t)*);
        }};
    }
    let file = ModelFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let h = file
        .hyper()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    out!("file: {}", path.display());
    out!(
        "format: {}",
        match &file {
            ModelFile::Gguf(g) => format!("GGUF v{} (alignment {})", g.version, g.alignment),
            ModelFile::Llama2c(_) => "llama2.c checkpoint (f32)".to_string(),
        }
    );
    out!("architecture: {:?}", h.arch);
    out!(
        "layers {} | dim {} | ffn {} | heads {} / kv heads {} | head_dim {} | vocab {} | context {}",
        h.n_layers, h.dim, h.hidden_dim, h.n_heads, h.n_kv_heads, h.head_dim, h.vocab_size, h.ctx_train
    );
    out!(
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
    out!(
        "\n{:<28} {:>6} {:>16} {:>12}",
        "tensor",
        "type",
        "shape",
        "bytes"
    );
    for name in &names {
        let t = file.tensor(name).map_err(|e| e.to_string())?;
        out!(
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
    out!("\nbytes per part:");
    for (name, bytes) in parts {
        out!(
            "  {:<22} {:>12} ({:.1} MiB)",
            name,
            bytes,
            bytes as f64 / 1048576.0
        );
    }
    out!("tensor types:");
    for (ty, n, bytes) in by_type {
        out!("  {:<6} {:>4} tensors {:>12} bytes", ty, n, bytes);
    }
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}
