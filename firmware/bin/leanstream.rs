//! `leanstream`: the offline CLI. generate, perplexity, inspect and bench on the CPU backend.

use clap::{Args, Parser, Subcommand};
use leanstream::backend::cuda::CudaOptions;
use leanstream::board::MemoryModel;
use leanstream::engine::any::{AnyEngine, Backend};
use leanstream::engine::generate::{generate, GenerateParams, GenerateStats};
use leanstream::engine::perplexity::perplexity;
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::{Arenas, EngineOptions};
use leanstream::load::open_model;
use leanstream::model::ModelFile;
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
    /// CUDA memory models, comma-separated: unified, discrete (default: the board's).
    #[arg(long, value_delimiter = ',')]
    memory: Vec<String>,
    /// CUDA: also time without the per-token graph (every kernel launched).
    #[arg(long)]
    compare_graph: bool,
    /// CPU worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
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
    /// Where to write the PNG plot.
    #[arg(long, default_value = "bench.png")]
    png: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => cmd_generate(a),
        Command::Perplexity(a) => cmd_perplexity(a),
        Command::Inspect { path } => cmd_inspect(&path),
        Command::Bench(a) => cmd_bench(a),
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

fn options(m: &ModelArgs) -> EngineOptions {
    let mut o = EngineOptions::default();
    if let Some(t) = m.threads {
        o.threads = t;
    }
    o
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

fn parse_memory(s: &str) -> Result<MemoryModel, String> {
    match s {
        "unified" => Ok(MemoryModel::Unified),
        "discrete" => Ok(MemoryModel::Discrete),
        _ => Err(format!("unknown memory model '{s}' (unified or discrete)")),
    }
}

fn boot<'a>(
    arenas: &'a mut Arenas,
    file: &ModelFile,
    m: &ModelArgs,
) -> Result<AnyEngine<'a>, String> {
    let backend = Backend::parse(&m.backend)?;
    AnyEngine::boot(arenas, file, backend, options(m), cuda_options(m)?).map_err(|e| match e {
        leanstream::engine::EngineError::Gpu(_) => e.to_string(),
        _ => format!("{}: {e}", m.model.display()),
    })
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
    format!(
        "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | finish: {}",
        s.prompt_tokens,
        s.prefill_tok_per_s(),
        s.generated_tokens,
        s.decode_tok_per_s(),
        s.finish.as_str()
    )
}

fn cmd_perplexity(a: PerplexityArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model.model, a.model.tokenizer.as_deref())?;
    let text = std::fs::read(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let text = text_prefix(&text, a.chunks, a.ctx);
    let tokens = tok.encode(text, false);
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot(&mut arenas, &file, &a.model)?;
    drop(file);
    let started = Instant::now();
    let r = perplexity(engine.decoder(), &tokens, a.ctx, a.chunks, &mut |w, p| {
        eprintln!("window {}: ppl {p:.4}", w + 1);
    })?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} windows of {} tokens, {} scored, {:.1} tok/s",
        r.windows,
        a.ctx,
        r.scored_tokens,
        r.scored_tokens as f64 / secs
    );
    println!("ppl = {:.4}", r.ppl);
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

fn cmd_bench(a: BenchArgs) -> Result<(), String> {
    use leanstream::bench;
    let threads = a.threads.unwrap_or(leanstream::board::CPU_THREADS);
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
                threads,
            };
            match backend {
                Backend::Cpu => configs.push(base),
                Backend::Cuda => {
                    for &memory in &memories {
                        for graph in [true, false] {
                            if graph || a.compare_graph {
                                configs.push(bench::Config {
                                    memory,
                                    graph,
                                    ..base.clone()
                                });
                            }
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
        leanstream::backend::cuda::probe()?;
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
