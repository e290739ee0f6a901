//! `leanstream`: the offline CLI. generate, perplexity, inspect, tokenize and bench on the CPU or
//! CUDA backend, the offline pipeline (calibrate, trace, requant, ...), and a client of a running
//! leanstreamd. This file holds the command list and what several commands share (the model
//! options and boot); each command is its own file.

// One file per subcommand (cmd_*.rs); what several share is below in this file, and the text
// the offline commands read is in text_args.rs.
mod cmd_bench;
mod cmd_board;
mod cmd_cache_sim;
mod cmd_calibrate;
mod cmd_calibrate_kv;
mod cmd_client;
mod cmd_controller;
mod cmd_controller_gpu;
mod cmd_flash;
mod cmd_generate;
mod cmd_gpu_decode_bench;
mod cmd_gpu_stream_bench;
mod cmd_gpu_timeline;
mod cmd_inspect;
mod cmd_perplexity;
mod cmd_requant;
mod cmd_stream_bench;
mod cmd_tokenize;
mod cmd_trace;
mod cmd_trace_stats;
mod cmd_train_baseline;
mod cmd_train_predictor;
mod text_args;

use clap::{Args, Parser, Subcommand};
use leanstream::backend::cpu::parse_packing;
use leanstream::backend::cpu::KernelSet;
use leanstream::board::MemoryModel;
use leanstream::engine::any::{parse_memory, AnyEngine, Backend};
use leanstream::engine::cuda_options::CudaOptions;
use leanstream::engine::generate::{generate, GenerateParams, GenerateStats};
use leanstream::engine::perplexity::perplexity;
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::tap::TapOptions;
use leanstream::engine::{Arenas, Decoder, Engine, EngineOptions, StreamArgs};
use leanstream::load::open_model;
use leanstream::model::flash::is_flash_image;
use leanstream::model::ModelFile;
use leanstream::quant::{Packing, Precision};
use leanstream::sparsity::cli::SparsityArgs;
use leanstream::sparsity::thresholds::{default_path, find_default, ThresholdTable};
use leanstream::sparsity::{FfnMode, FfnOptions, Score};
use leanstream::tokenizer::chat::{ChatFormat, ChatMessage};
use leanstream::tokenizer::Tokenizer;
use leanstream_tools::bench::{median, Ablation};
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
    Generate(cmd_generate::GenerateArgs),
    /// Perplexity of a text file over non-overlapping windows (no BOS); last line `ppl = X`.
    Perplexity(cmd_perplexity::PerplexityArgs),
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
    Tokenize(cmd_tokenize::TokenizeArgs),
    /// Prefill and decode speed; writes JSON and a Markdown table.
    #[command(after_help = ablations_help())]
    Bench(cmd_bench::BenchArgs),
    /// Requantize a GGUF offline into a precision's GGML types (Q8_0 / Q4_0 / F16), so that boot
    /// imports it as it is; prints what it did and the requantization error.
    Requant(cmd_requant::RequantArgs),
    /// Write a GGUF as a flash image for a board: the dense part, each layer's FFN as 4 KiB
    /// blocks of neuron bundles (read by O_DIRECT as they are), the placement, the thresholds.
    Flash(cmd_flash::FlashArgs),
    /// Fit the int8 KV cache's layout cost model on this board (a short microbenchmark) and
    /// write it as a `kvcost` table for the model.
    CalibrateKv(cmd_calibrate_kv::CalibrateKvArgs),
    /// Per-layer FFN activation thresholds for target sparsities, from the dense model over a
    /// text; written to a tables/ file.
    Calibrate(cmd_calibrate::CalibrateArgs),
    /// Record per layer and token the FFN's residual, input, staged partial residuals and
    /// neuron activations (safetensors).
    Trace(cmd_trace::TraceArgs),
    /// Statistics of a trace: magnitude shares, active-set overlap, one-shot and staged recall.
    TraceStats(cmd_trace_stats::TraceStatsArgs),
    /// Train the stacked learnable hashing predictor on a trace (one net per layer) and write
    /// its table (`hashpred`).
    TrainPredictor(cmd_train_predictor::TrainPredictorArgs),
    /// Predictors against the oracle on a held-out trace: size, latency per layer on one core,
    /// recall, top-10% recall and loading redundancy, beside the stale baseline (JSON).
    PredictorReport(cmd_train_predictor::PredictorReportArgs),
    /// Predictor tables' latency per layer on the core it runs on, from seeded inputs, without
    /// the model or a trace (hashpred and mlppred tables).
    PredictorLatency(cmd_train_predictor::PredictorLatencyArgs),
    /// Train a baseline predictor on a trace: DejaVu's low-rank MLP (on the layer's or the
    /// previous layer's input) or a binarized MLP; writes its table (`mlppred`).
    TrainBaseline(cmd_train_baseline::TrainBaselineArgs),
    /// Train the learned cache policy's reuse-distance table on a trace's access stream
    /// (`reuse`; `--cache learned --eviction`, `cache-sim --eviction`).
    TrainEviction(cmd_train_baseline::TrainEvictionArgs),
    /// The streamed FFN on this disk: decode speed, miss ratio (with Belady's floor), bytes read
    /// per token and I/O wait, per image, sparsity, budget and cache policy; JSON, Markdown, PNG.
    StreamBench(cmd_stream_bench::StreamBenchArgs),
    /// The GPU's streamed FFN on this disk, replaying block sets recorded from a real decode
    /// (stream-bench --record-sets): FFN time per token, hit ratio and bytes read per memory
    /// model and budget, beside the reads alone and every block resident.
    GpuStreamBench(cmd_gpu_stream_bench::GpuStreamBenchArgs),
    /// Whole decode steps on the GPU with the FFN streamed from a flash image, replaying block
    /// sets recorded from a real decode, per memory model, sets, cache policy and budget,
    /// beside the same model with every weight in memory.
    GpuDecodeBench(cmd_gpu_decode_bench::GpuDecodeBenchArgs),
    /// Where one decode step's time goes on the GPU, kernel by kernel inside the CUDA graph:
    /// each kernel's start, wait and end read from the GPU's clock.
    GpuTimeline(cmd_gpu_timeline::GpuTimelineArgs),
    /// The streaming controller (LeanStream 3.2.3): profile plans, solve the LUT, compare.
    #[command(subcommand)]
    Controller(cmd_controller::ControllerCommand),
    /// Miss ratios of the weight cache's policies (lru, lfu, hot) and Belady's floor on a
    /// trace's activations.
    CacheSim(cmd_cache_sim::CacheSimArgs),
    /// Ask a running leanstreamd; the answer streams as it comes.
    Ask(cmd_client::AskArgs),
    /// An interactive chat with a running leanstreamd (/exit to leave, /reset to forget).
    Chat(cmd_client::ClientArgs),
    /// Health and metrics of a running leanstreamd.
    Status {
        /// The daemon's socket (default: the board's).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ModelArgs {
    /// GGUF file, llama2.c checkpoint, or flash image (`--image`: its FFN streams from disk).
    #[arg(long, alias = "image")]
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
    #[command(flatten)]
    low: LowBitArgs,
    #[command(flatten)]
    sparsity: SparsityArgs,
    #[command(flatten)]
    stream: StreamArgs,
}

#[derive(Args, Clone)]
struct LowBitArgs {
    /// native (the file's own types, f16 KV), f16, w8a8 or w4a8 (int8 KV for the last two).
    #[arg(long, default_value = "native", value_parser = Precision::parse)]
    precision: Precision,
    /// int4 packing (w4a8, and Q4_0 matrices at native): contiguous, interleaved, swizzled
    /// (bit-identical results), or auto: the one this CPU decodes fastest in (swizzled with
    /// VNNI or on aarch64, interleaved on x86 without VNNI).
    #[arg(long, default_value = "auto", value_parser = parse_packing)]
    packing: Packing,
    /// KV layout policy for the int8 cache: adaptive, token-major or head-tiles.
    #[arg(long, default_value = "adaptive")]
    kv_layout: String,
    /// A kvcost table from `leanstream calibrate-kv` (default: built-in constants).
    #[arg(long)]
    kv_cost: Option<PathBuf>,
    /// Ablations, comma-separated: run with these fast paths off (e.g. `no-vnni`,
    /// `no-graph`); `bench` times each beside the configuration instead. The list is in
    /// `leanstream bench --help` and docs/BENCHMARKS.md.
    #[arg(long, value_delimiter = ',', value_parser = Ablation::parse)]
    ablate: Vec<Ablation>,
}

impl LowBitArgs {
    /// The CPU kernels: the best this CPU has, less the CPU ablations asked for.
    fn kernels(&self) -> KernelSet {
        let mut k = KernelSet::best();
        for a in &self.ablate {
            a.apply_cpu(&mut k);
        }
        k
    }
}

/// `bench --help`'s list of the ablations `--ablate` takes.
fn ablations_help() -> String {
    format!(
        "Ablations (--ablate a,b,...; each is timed beside the configuration it changes):\n{}",
        leanstream_tools::bench::ablate::help()
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => cmd_generate::cmd_generate(a),
        Command::Perplexity(a) => cmd_perplexity::cmd_perplexity(a),
        Command::Inspect { path } => cmd_inspect::cmd_inspect(&path),
        Command::Board(a) => cmd_board::run(a),
        Command::Tokenize(a) => cmd_tokenize::cmd_tokenize(a).map(|text| {
            // A reader that stops early (`| head`) ends the listing quietly.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }),
        Command::Bench(a) => cmd_bench::cmd_bench(a),
        Command::Requant(a) => cmd_requant::cmd_requant(a),
        Command::Flash(a) => cmd_flash::cmd_flash(a),
        Command::CalibrateKv(a) => cmd_calibrate_kv::cmd_calibrate_kv(a),
        Command::Calibrate(a) => cmd_calibrate::cmd_calibrate(a),
        Command::Trace(a) => cmd_trace::cmd_trace(a),
        Command::TraceStats(a) => cmd_trace_stats::cmd_trace_stats(a),
        Command::TrainPredictor(a) => cmd_train_predictor::cmd_train_predictor(a),
        Command::PredictorReport(a) => cmd_train_predictor::cmd_predictor_report(a),
        Command::PredictorLatency(a) => cmd_train_predictor::cmd_predictor_latency(a),
        Command::TrainBaseline(a) => cmd_train_baseline::cmd_train_baseline(a),
        Command::TrainEviction(a) => cmd_train_baseline::cmd_train_eviction(a),
        Command::CacheSim(a) => cmd_cache_sim::cmd_cache_sim(a),
        Command::StreamBench(a) => cmd_stream_bench::cmd_stream_bench(a),
        Command::GpuStreamBench(a) => cmd_gpu_stream_bench::cmd_gpu_stream_bench(a),
        Command::GpuDecodeBench(a) => cmd_gpu_decode_bench::cmd_gpu_decode_bench(a),
        Command::GpuTimeline(a) => cmd_gpu_timeline::cmd_gpu_timeline(a),
        Command::Controller(c) => cmd_controller::cmd_controller(c),
        Command::Ask(a) => cmd_client::cmd_ask(a),
        Command::Chat(a) => cmd_client::cmd_chat(a),
        Command::Status { socket } => cmd_client::cmd_status(socket),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
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
    o.kernels = low.kernels();
    if let Some(kv) = low.ablate.iter().find_map(|a| a.cpu_kv()) {
        o.kv = kv;
    }
    if is_flash_image(&m.model) {
        o.stream = Some(m.stream.options(&m.model)?);
    }
    Ok(o)
}

fn cuda_options(m: &ModelArgs) -> Result<CudaOptions, String> {
    let mut o = CudaOptions::default();
    if let Some(mem) = &m.memory {
        o.memory = parse_memory(mem)?;
    }
    for a in &m.low.ablate {
        a.apply_cuda(&mut o);
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
