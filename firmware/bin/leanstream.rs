//! `leanstream`: the offline CLI. generate, perplexity, inspect, tokenize and bench on the CPU or
//! CUDA backend, and a client of a running leanstreamd.

mod tokenize;

mod cmd_board;

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
    Bench(BenchArgs),
    /// Requantize a GGUF offline into a precision's GGML types (Q8_0 / Q4_0 / F16), so that boot
    /// imports it as it is; prints what it did and the requantization error.
    Requant(RequantArgs),
    /// Fit the int8 KV cache's layout cost model on this board (a short microbenchmark) and
    /// write it as a `kvcost` table for the model.
    CalibrateKv(CalibrateKvArgs),
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
struct RequantArgs {
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
struct CalibrateKvArgs {
    /// The model the table is for (its KV shape is benchmarked; the table carries its identity).
    #[arg(long)]
    model: PathBuf,
    /// Where to write the table (default: tables/kvcost-<model file stem>.bin).
    #[arg(long)]
    out: Option<PathBuf>,
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
struct TraceArgs {
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
struct TraceStatsArgs {
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

#[derive(Args)]
struct BenchArgs {
    /// Model files, comma-separated (each is run in every configuration).
    #[arg(long, value_delimiter = ',', required = true)]
    model: Vec<PathBuf>,
    /// Tokenizer file for llama2.c checkpoints.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Backends, comma-separated: cpu, cuda.
    #[arg(long, value_delimiter = ',', default_value = "cpu")]
    backend: Vec<String>,
    #[command(flatten)]
    low: LowBitArgs,
    /// FFN configurations (`--ffn`, `--score`, `--sparsity` lists) run side by side on the CPU
    /// when `--ffn` names a sparse mode.
    #[command(flatten)]
    sparsity: SparsityArgs,
    /// CUDA memory models, comma-separated: unified, discrete (default: the board's).
    #[arg(long, value_delimiter = ',')]
    memory: Vec<String>,
    /// CUDA: also time without the per-token graph (every kernel launched).
    #[arg(long)]
    compare_graph: bool,
    /// CUDA: also time with every product kernel narrow (the ablation of the wide kernels that
    /// big products take).
    #[arg(long)]
    compare_narrow: bool,
    /// CUDA: also time with every product kernel wide (small products too).
    #[arg(long)]
    compare_wide: bool,
    /// CUDA: also time with the residual's norm made once by the last block of the product
    /// before (the ablation of products that norm their own input in each block).
    #[arg(long)]
    compare_norm_tail: bool,
    /// CUDA: also time with every product that reads the normed residual norming it in each
    /// block, at any model size (the default does so up to dim 1536).
    #[arg(long)]
    compare_norm_in_block: bool,
    /// CUDA: also time without pulling the next weights into L2 during attention.
    #[arg(long)]
    compare_no_prefetch: bool,
    /// CUDA: also time with each head's attention in one block at any context length.
    #[arg(long)]
    compare_no_split_attention: bool,
    /// CUDA: also time with each head's attention split over one more block every N
    /// positions (the default is every 256).
    #[arg(long, value_name = "N")]
    compare_attention_slice: Option<usize>,
    /// CUDA (sm_90): also time with every kernel launched after the one before has finished.
    #[arg(long)]
    compare_no_pdl: bool,
    /// CUDA (sm_90): also time with each product block pulling its first weights into L2
    /// while it waits for the kernel before.
    #[arg(long)]
    compare_pdl_prefetch: bool,
    /// CUDA at w8a8/w4a8: also time with the KV cache in f32 (the ablation of the int8 cache;
    /// with --long-context too).
    #[arg(long)]
    compare_f32_kv: bool,
    /// CPU worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    /// Prompt length in tokens (the prefill measured).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens generated after the prompt (the decode measured).
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
    /// Where to write the PNG plot.
    #[arg(long, default_value = "bench.png")]
    png: PathBuf,
    /// Configurations to run side by side, comma-separated: PRECISION[/PACKING][+FLAG]...,
    /// flags `no-adaptive-kv` (one token-major KV segment), `head-tiles` (one head-tiled
    /// segment), `no-deferred-dequant`, `no-vnni`, `no-avx512`; e.g. `native,f16,w8a8,w4a8/swizzled+no-adaptive-kv`.
    /// Default: the one configuration the model flags give.
    #[arg(long)]
    configs: Option<String>,
    /// Long-context mode: decode positions 0..N one token at a time (N capped at the context)
    /// and report latency per 512-token window instead of prefill/decode rates.
    #[arg(long)]
    long_context: Option<usize>,
}

/// One bench configuration: its label and low-bit options.
fn parse_config(spec: &str, base: &LowBitArgs) -> Result<(String, LowBitArgs), String> {
    let mut low = base.clone();
    low.no_deferred_dequant = false;
    low.no_vnni = false;
    low.no_avx512 = false;
    low.kv_layout = "adaptive".into();
    let mut parts = spec.split('+');
    let head = parts.next().unwrap_or_default();
    let (prec, pack) = match head.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (head, None),
    };
    low.precision = Precision::parse(prec)?;
    if let Some(p) = pack {
        low.packing = Packing::parse(p)?;
    }
    for flag in parts {
        match flag {
            "no-adaptive-kv" => low.kv_layout = "token-major".into(),
            "head-tiles" => low.kv_layout = "head-tiles".into(),
            "no-deferred-dequant" => low.no_deferred_dequant = true,
            "no-vnni" => low.no_vnni = true,
            "no-avx512" => low.no_avx512 = true,
            _ => {
                return Err(format!(
                    "unknown bench flag '{flag}' in '{spec}' (no-adaptive-kv, head-tiles, no-deferred-dequant, no-vnni, no-avx512)"
                ))
            }
        }
    }
    let label = if low.precision == Precision::W4a8 && !spec.contains('/') {
        format!("{spec} ({})", low.packing.name())
    } else {
        spec.to_string()
    };
    Ok((label, low))
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
        Command::Bench(a) => cmd_bench(a),
        Command::Requant(a) => cmd_requant(a),
        Command::CalibrateKv(a) => cmd_calibrate_kv(a),
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
    let (hist, levels) = leanstream::offline::calibrate::calibrate(
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

fn cmd_trace(a: TraceArgs) -> Result<(), String> {
    use leanstream::offline::trace::{TraceMeta, TraceWriter};
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

fn cmd_trace_stats(a: TraceStatsArgs) -> Result<(), String> {
    use leanstream::offline::trace::TraceReader;
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
    let json = leanstream::offline::trace_stats::trace_stats(
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

fn cmd_bench(a: BenchArgs) -> Result<(), String> {
    if a.sparsity.ffn.split(',').any(|m| m.trim() != "dense") {
        if a.model.len() != 1
            || a.backend.iter().any(|b| b != "cpu")
            || a.configs.is_some()
            || a.long_context.is_some()
        {
            return Err(
                "the sparse FFN runs on the CPU backend only for now: sparse --ffn takes one model on the cpu backend, without --configs or --long-context".into(),
            );
        }
        return cmd_bench_ffn(a);
    }
    if a.long_context.is_some() && a.backend.iter().any(|b| b == "cuda") {
        if a.model.len() != 1 || a.backend.len() != 1 || a.configs.is_some() {
            return Err(
                "--long-context on the cuda backend takes one model and no --configs".into(),
            );
        }
        return cmd_bench_long_cuda(a);
    }
    if a.configs.is_some() || a.long_context.is_some() {
        if a.model.len() != 1 || a.backend.iter().any(|b| b != "cpu") {
            return Err("--configs and --long-context take one model on the cpu backend".into());
        }
        return cmd_bench_configs(a);
    }
    cmd_bench_backends(a)
}

/// Models x backends x memory models (x graph on/off), at the model flags' precision.
fn cmd_bench_backends(a: BenchArgs) -> Result<(), String> {
    use leanstream::bench;
    let threads = a
        .threads
        .map(threads_at_least_one)
        .unwrap_or(leanstream::board::CPU_THREADS);
    let memories = if a.memory.is_empty() {
        vec![CudaOptions::default().memory]
    } else {
        a.memory
            .iter()
            .map(|m| parse_memory(m))
            .collect::<Result<_, _>>()?
    };
    let mut configs = Vec::new();
    for model in &a.model {
        for b in &a.backend {
            let backend = Backend::parse(b)?;
            let base = bench::Config {
                model: model.clone(),
                tokenizer: a.tokenizer.clone(),
                backend,
                memory: MemoryModel::None,
                graph: true,
                products: ProductKernels::Auto,
                in_block_norm: InBlockNorm::Auto,
                prefetch: true,
                attention_slice: leanstream::engine::cuda_options::ATTENTION_SLICE,
                dependent_launch: DependentLaunch::On,
                f32_kv: false,
                threads,
                precision: a.low.precision,
                packing: a.low.packing,
            };
            match backend {
                Backend::Cpu => configs.push(base),
                Backend::Cuda => {
                    for &memory in &memories {
                        let mut push = |graph, products, in_block_norm, prefetch| {
                            configs.push(bench::Config {
                                memory,
                                graph,
                                products,
                                in_block_norm,
                                prefetch,
                                ..base.clone()
                            })
                        };
                        let auto = InBlockNorm::Auto;
                        push(true, ProductKernels::Auto, auto, true);
                        if a.compare_graph {
                            push(false, ProductKernels::Auto, auto, true);
                        }
                        if a.compare_narrow {
                            push(true, ProductKernels::Narrow, auto, true);
                        }
                        if a.compare_wide {
                            push(true, ProductKernels::Wide, auto, true);
                        }
                        if a.compare_norm_tail {
                            push(true, ProductKernels::Auto, InBlockNorm::Never, true);
                        }
                        if a.compare_norm_in_block {
                            push(true, ProductKernels::Auto, InBlockNorm::Always, true);
                        }
                        if a.compare_no_prefetch {
                            push(true, ProductKernels::Auto, auto, false);
                        }
                        if a.compare_no_split_attention {
                            configs.push(bench::Config {
                                memory,
                                attention_slice: 0,
                                ..base.clone()
                            });
                        }
                        if let Some(n) = a.compare_attention_slice {
                            configs.push(bench::Config {
                                memory,
                                attention_slice: n,
                                ..base.clone()
                            });
                        }
                        for (asked, pdl) in [
                            (a.compare_no_pdl, DependentLaunch::Off),
                            (a.compare_pdl_prefetch, DependentLaunch::Prefetch),
                        ] {
                            if asked {
                                configs.push(bench::Config {
                                    memory,
                                    dependent_launch: pdl,
                                    ..base.clone()
                                });
                            }
                        }
                        if a.compare_f32_kv {
                            configs.push(bench::Config {
                                memory,
                                f32_kv: true,
                                ..base.clone()
                            });
                        }
                    }
                }
            }
        }
    }
    let settings = bench::Settings {
        prompt_tokens: a.prompt_tokens,
        gen_tokens: a.gen_tokens,
        reps: a.reps,
    };
    let copy_gbps = if configs.iter().any(|c| c.backend == Backend::Cuda) {
        leanstream::engine::any::probe_cuda()?;
        let bw = bench::copy_bandwidth_gbps()?;
        eprintln!("device-to-device copy: {bw:.0} GB/s");
        Some(bw)
    } else {
        None
    };
    let rows = bench::run(&configs, &settings, copy_gbps, &mut |line| {
        eprintln!("{line}")
    })?;
    let md = bench::markdown(&rows, copy_gbps);
    let json = bench::json(&rows, copy_gbps, &settings);
    std::fs::write(&a.json, &json).map_err(|e| format!("{}: {e}", a.json.display()))?;
    std::fs::write(&a.markdown, &md).map_err(|e| format!("{}: {e}", a.markdown.display()))?;
    let title = format!(
        "leanstream bench on {} ({} prompt, {} generated tokens)",
        leanstream::board::NAME,
        a.prompt_tokens,
        a.gen_tokens
    );
    bench::plot::decode_bars(&rows, &title, &a.png)?;
    print!("{md}");
    Ok(())
}

fn cmd_requant(a: RequantArgs) -> Result<(), String> {
    let precision = Precision::parse(&a.precision)?;
    let out = a.out.unwrap_or_else(|| {
        let stem = a.model.file_stem().unwrap_or_default().to_string_lossy();
        a.model.with_file_name(format!("{stem}.{precision}.gguf"))
    });
    let report = leanstream::offline::requant::requant(&a.model, precision, &out)?;
    eprintln!(
        "requant: {} -> {} at {precision}:\n{report}",
        a.model.display(),
        out.display()
    );
    println!("{}", out.display());
    Ok(())
}

fn cmd_calibrate_kv(a: CalibrateKvArgs) -> Result<(), String> {
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
    let (model, points) = kv::calibrate::calibrate(shape, &[64, 256, 1024, 4096]);
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prefill and decode speed of every configuration the sparsity options name, side by side in
/// one process: each configuration has its own engine, and the repetitions alternate between
/// them so that a busy moment of the machine touches all of them alike.
fn cmd_bench_ffn(a: BenchArgs) -> Result<(), String> {
    let model = ModelArgs {
        model: a.model[0].clone(),
        tokenizer: a.tokenizer.clone(),
        threads: a.threads.map(threads_at_least_one),
        backend: "cpu".into(),
        memory: None,
        no_graph: false,
        low: a.low.clone(),
        sparsity: a.sparsity.clone(),
    };
    let (file, tok) = open_model(&model.model, model.tokenizer.as_deref())?;
    let configs = model.sparsity.configs(&model.model, &file)?;
    let name = model
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prompt = bench_prompt(&tok, a.prompt_tokens);
    let mut arenas: Vec<Arenas> = configs
        .iter()
        .map(|_| Arenas::from_board().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut engines: Vec<Engine> = arenas
        .iter_mut()
        .zip(&configs)
        .enumerate()
        .map(|(i, (ar, c))| boot_cpu(ar, &file, &model, &model.low, c.clone(), i == 0))
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
            let logits_token = sampler.sample(engine.prefill(&prompt, 0));
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
    let d: Vec<f64> = decode.iter().cloned().map(median).collect();
    // Against dense: the median over repetitions of the ratio within each repetition (the
    // configurations of one repetition run back to back, so a slow moment of the machine
    // touches both sides of a ratio).
    let dense_at = configs.iter().position(|c| c.mode == FfnMode::Dense);
    let vs_dense: Vec<Option<f64>> = decode
        .iter()
        .map(|runs| {
            dense_at.map(|b| median(runs.iter().zip(&decode[b]).map(|(x, y)| x / y).collect()))
        })
        .collect();
    let mut rows = Vec::new();
    let mut md = String::from("| model | backend | threads | ffn | neurons dropped | prompt tokens | gen tokens | prefill tok/s | decode tok/s | decode vs dense |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (i, c) in configs.iter().enumerate() {
        let ratio = vs_dense[i];
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
    write_tables(&a, &json, &md)
}

/// Low-bit configurations of one model on the CPU (`--configs`, `--long-context`).
fn cmd_bench_configs(a: BenchArgs) -> Result<(), String> {
    let model = ModelArgs {
        model: a.model[0].clone(),
        tokenizer: a.tokenizer.clone(),
        threads: a.threads.map(threads_at_least_one),
        backend: "cpu".into(),
        memory: None,
        no_graph: false,
        low: a.low.clone(),
        sparsity: a.sparsity.clone(),
    };
    let (file, tok) = open_model(&model.model, model.tokenizer.as_deref())?;
    let ffn = model.sparsity.single(&model.model, &file)?;
    let name = model
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let configs: Vec<(String, LowBitArgs)> = match &a.configs {
        None => vec![(model.low.precision.to_string(), model.low.clone())],
        Some(list) => list
            .split(',')
            .map(|c| parse_config(c.trim(), &model.low))
            .collect::<Result<_, _>>()?,
    };
    let prompt = bench_prompt(&tok, a.prompt_tokens);
    // Every configuration is booted at once, each in its own arenas (mapped at the board's
    // budgets, backed only where touched), and the repetitions go round-robin over them, so a
    // busy moment of the machine lands on all of them alike.
    let mut arenas: Vec<Arenas> = configs
        .iter()
        .map(|_| Arenas::from_board().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut engines = Vec::new();
    for (ar, (_, low)) in arenas.iter_mut().zip(&configs) {
        let mut engine = boot_cpu(ar, &file, &model, low, ffn.clone(), true)?;
        let idx = engine.take_sample_buffer().expect("fresh engine");
        engines.push((engine, Sampler::new(SamplerConfig::default(), idx)));
    }
    drop(file);
    let threads = engines[0].0.threads();
    let mut rows_json = Vec::new();
    let mut rows_md = Vec::new();
    if let Some(n) = a.long_context {
        for ((engine, sampler), (label, low)) in engines.iter_mut().zip(&configs) {
            low.set_kernels();
            let step = |e: &mut Engine, t: u32, p: usize| sampler.sample(e.forward(t, p));
            let (json, md) = long_context(engine, step, &prompt, n, label, segments_text)?;
            rows_json.push(json);
            rows_md.push(md);
        }
    } else {
        let context = engines[0].0.context;
        if prompt.len() + a.gen_tokens > context {
            return Err(format!(
                "prompt + gen tokens ({}) exceed the context ({context})",
                prompt.len() + a.gen_tokens,
            ));
        }
        // The prompt (batched, then its last token's logits) for each configuration in turn;
        // then decode token by token, every configuration in turn: on a shared machine a busy
        // moment then lands on all of them alike. Greedy decoding may hit end-of-text early;
        // decode a fixed count by forwarding sampled tokens directly.
        let mut prefill = vec![Vec::new(); configs.len()];
        let mut decode = vec![Vec::new(); configs.len()];
        let n = configs.len();
        let set_flags = |low: &LowBitArgs| low.set_kernels();
        for _ in 0..a.reps.max(1) {
            let (mut tp, mut td) = (vec![0f64; n], vec![0f64; n]);
            let mut next = vec![0u32; n];
            for (i, ((engine, sampler), (_, low))) in engines.iter_mut().zip(&configs).enumerate() {
                set_flags(low);
                let t0 = Instant::now();
                next[i] = sampler.sample(engine.prefill(&prompt, 0));
                tp[i] = t0.elapsed().as_secs_f64();
            }
            for pos in prompt.len()..prompt.len() + a.gen_tokens {
                for (i, ((engine, sampler), (_, low))) in
                    engines.iter_mut().zip(&configs).enumerate()
                {
                    set_flags(low);
                    let t0 = Instant::now();
                    next[i] = sampler.sample(engine.forward(next[i], pos));
                    td[i] += t0.elapsed().as_secs_f64();
                }
            }
            for i in 0..n {
                prefill[i].push(prompt.len() as f64 / tp[i]);
                decode[i].push(a.gen_tokens as f64 / td[i]);
            }
        }
        let mut base = None;
        for (i, (engine, _)) in engines.iter().enumerate() {
            let label = &configs[i].0;
            let (p, d) = (median(prefill[i].clone()), median(decode[i].clone()));
            let ms = 1000.0 / d;
            let base = *base.get_or_insert(ms);
            let segs = segments_text(engine);
            rows_json.push(format!(
                "    {{\"config\": {label:?}, \"prefill_tok_per_s\": {p:.2}, \"decode_tok_per_s\": {d:.2}, \"decode_ms_per_token\": {ms:.3}, \"vs_first\": {:.3}, \"kv_segments\": {segs:?}}}",
                base / ms
            ));
            rows_md.push(format!(
                "| {label} | {p:.1} | {d:.1} | {ms:.2} | {:.2}x | {segs} |",
                base / ms
            ));
        }
    }
    leanstream::backend::cpu::lowbit::set_deferred_dequant(true);
    let header = if a.long_context.is_some() {
        long_context_header("KV segments")
    } else {
        "| config | prefill tok/s | decode tok/s | decode ms/token | speed vs first row | KV segments |\n|---|---|---|---|---|---|".into()
    };
    let json = format!(
        "{{\n  \"model\": {:?},\n  \"backend\": \"cpu\",\n  \"threads\": {threads},\n  \"board\": {:?},\n  \"prompt_tokens\": {},\n  \"gen_tokens\": {},\n  \"reps\": {},\n  \"long_context\": {},\n  \"configs\": [\n{}\n  ]\n}}\n",
        name,
        leanstream::board::NAME,
        prompt.len(),
        a.gen_tokens,
        a.reps,
        a.long_context.map_or("null".to_string(), |n| n.to_string()),
        rows_json.join(",\n")
    );
    let md = format!(
        "{name}, cpu, {threads} threads, board {}\n\n{header}\n{}\n",
        leanstream::board::NAME,
        rows_md.join("\n")
    );
    write_tables(&a, &json, &md)
}

/// A fixed, ordinary English prompt of `n` tokens, repeated to length (speed does not depend
/// on it).
fn bench_prompt(tok: &leanstream::tokenizer::Tokenizer, n: usize) -> Vec<u32> {
    let seed_text = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea, there lived a curious child who loved to read about the stars. ";
    let mut prompt = tok.encode(&seed_text.repeat(1 + n / 8), tok.add_bos_default());
    prompt.truncate(n.max(1));
    prompt
}

/// `--long-context N --backend cuda`: the latency per token from position 0 to N on the GPU,
/// each token's greedy pick made on the device, per 512-token window as the CPU's mode; with
/// `--compare-no-split-attention`, also with each head's attention in one block, and with
/// `--compare-no-pdl`, also without dependent launch.
#[cfg(not(feature = "cuda"))]
fn cmd_bench_long_cuda(_: BenchArgs) -> Result<(), String> {
    Err(leanstream::engine::any::NO_CUDA.into())
}

#[cfg(feature = "cuda")]
fn cmd_bench_long_cuda(a: BenchArgs) -> Result<(), String> {
    let n = a.long_context.unwrap_or_default();
    let (file, tok) = open_model(&a.model[0], a.tokenizer.as_deref())?;
    let name = a.model[0]
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prompt = bench_prompt(&tok, a.prompt_tokens);
    let mut base = CudaOptions {
        precision: a.low.precision,
        ..CudaOptions::default()
    };
    if let Some(m) = a.memory.first() {
        base.memory = parse_memory(m)?;
    }
    let mut configs = vec![("split attention", base)];
    if a.compare_no_split_attention {
        let one = CudaOptions {
            attention_slice: 0,
            ..base
        };
        configs.push(("one block a head", one));
    }
    if a.compare_no_pdl {
        let off = CudaOptions {
            dependent_launch: DependentLaunch::Off,
            ..base
        };
        configs.push(("no dependent launch", off));
    }
    if a.compare_f32_kv {
        let f32_kv = CudaOptions {
            f32_kv: true,
            ..base
        };
        configs.push(("f32 KV cache", f32_kv));
    }
    let (mut rows_json, mut rows_md, mut gpu) = (Vec::new(), Vec::new(), String::new());
    for (label, opts) in configs {
        let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
        let mut engine = leanstream::engine::cuda::CudaEngine::boot(&mut arenas, &file, opts)
            .map_err(|e| format!("{label}: {e}"))?;
        gpu = engine.gpu.name.clone();
        let step =
            |e: &mut leanstream::engine::cuda::CudaEngine, t: u32, p: usize| e.forward_greedy(t, p);
        let kv = |e: &leanstream::engine::cuda::CudaEngine| {
            format!("{} token-major", if e.int8_kv { "int8" } else { "f32" })
        };
        let (json, md) = long_context(&mut engine, step, &prompt, n, label, kv)?;
        rows_json.push(json);
        rows_md.push(md);
    }
    let memory = leanstream::bench::memory_name(base.memory);
    let json = format!(
        "{{\n  \"model\": {name:?},\n  \"backend\": \"cuda\",\n  \"gpu\": {gpu:?},\n  \"memory\": {memory:?},\n  \"board\": {:?},\n  \"long_context\": {n},\n  \"configs\": [\n{}\n  ]\n}}\n",
        leanstream::board::NAME,
        rows_json.join(",\n")
    );
    let md = format!(
        "{name}, cuda {gpu}, {memory} memory, board {}\n\n{}\n{}\n",
        leanstream::board::NAME,
        long_context_header("KV cache"),
        rows_md.join("\n")
    );
    write_tables(&a, &json, &md)
}

/// The Markdown header of `long_context`'s rows (`kv`: what its last column describes).
fn long_context_header(kv: &str) -> String {
    format!("| config | positions | first-window median ms | last-window median ms | growth | linear bound | worst p99/median (window) | {kv} |\n|---|---|---|---|---|---|---|---|")
}

/// Writes a bench's JSON and Markdown where `a` says, and prints the Markdown.
fn write_tables(a: &BenchArgs, json: &str, md: &str) -> Result<(), String> {
    std::fs::write(&a.json, json).map_err(|e| format!("{}: {e}", a.json.display()))?;
    std::fs::write(&a.markdown, md).map_err(|e| format!("{}: {e}", a.markdown.display()))?;
    print!("{md}");
    Ok(())
}

/// The KV chain as `layout[start..end]` items.
fn segments_text(e: &Engine) -> String {
    e.kv_segments()
        .iter()
        .map(|s| format!("{}[{}..{}]", s.layout.name(), s.start, s.start + s.len))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Decodes positions 0..n (the prompt's tokens, then sampled ones), timing each step; per
/// window of 512 positions, the median and p99. The linear bound is the growth the work
/// predicts: matrix MACs per token plus attention MACs growing with the position.
/// `step` runs one token and returns the next (the CPU samples its logits; the GPU picks the
/// greedy token on the device); `segs` describes the KV cache after the run.
fn long_context<D: Decoder>(
    engine: &mut D,
    mut step: impl FnMut(&mut D, u32, usize) -> u32,
    prompt: &[u32],
    n: usize,
    label: &str,
    segs: impl Fn(&D) -> String,
) -> Result<(String, String), String> {
    let n = n.min(engine.context());
    const W: usize = 512;
    if n < 2 * W {
        return Err(format!(
            "--long-context needs at least {} positions (context {})",
            2 * W,
            engine.context()
        ));
    }
    let mut ms = Vec::with_capacity(n);
    let mut token = prompt[0];
    for pos in 0..n {
        let t0 = Instant::now();
        let next = step(engine, token, pos);
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        token = if pos + 1 < prompt.len() {
            prompt[pos + 1]
        } else {
            next
        };
    }
    let mut worst = (0f64, 0usize);
    let mut medians = Vec::new();
    for (w, chunk) in ms.chunks(W).enumerate() {
        if chunk.len() < W {
            break;
        }
        let mut v = chunk.to_vec();
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        let p99 = v[(v.len() * 99) / 100];
        medians.push(med);
        if p99 / med > worst.0 {
            worst = (p99 / med, w);
        }
    }
    let h = engine.hyper();
    let (q_dim, kv_dim) = (h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim);
    let matrix = (h.n_layers * (2 * h.dim * q_dim + 2 * h.dim * kv_dim + 3 * h.dim * h.hidden_dim)
        + h.vocab_size * h.dim) as f64;
    let attn_per_pos = (2 * h.n_layers * q_dim) as f64;
    let mid = |w: usize| (w * W + W / 2) as f64;
    let last = medians.len() - 1;
    let bound = (matrix + attn_per_pos * mid(last)) / (matrix + attn_per_pos * mid(0));
    let growth = medians[last] / medians[0];
    let segs = segs(engine);
    let json = format!(
        "    {{\"config\": {label:?}, \"positions\": {n}, \"window_median_ms\": {:?}, \"first_median_ms\": {:.3}, \"last_median_ms\": {:.3}, \"growth\": {growth:.3}, \"linear_bound\": {bound:.3}, \"worst_p99_over_median\": {:.3}, \"worst_window\": {}, \"kv_segments\": {segs:?}}}",
        medians.iter().map(|m| (m * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        medians[0],
        medians[last],
        worst.0,
        worst.1
    );
    let md = format!(
        "| {label} | {n} | {:.2} | {:.2} | {growth:.2}x | {bound:.2}x | {:.2} ({}..{}) | {segs} |",
        medians[0],
        medians[last],
        worst.0,
        worst.1 * W,
        (worst.1 + 1) * W
    );
    Ok((json, md))
}
