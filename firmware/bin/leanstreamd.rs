//! `leanstreamd`: the inference daemon. Boots the model into the board's arenas, then serves
//! OpenAI-compatible HTTP over a Unix socket until SIGTERM or SIGINT.

use clap::Parser;
use leanstream::backend::cpu::parse_packing;
use leanstream::board;
use leanstream::engine::any::{parse_memory, AnyEngine, Backend};
use leanstream::engine::cuda_options::CudaOptions;
use leanstream::engine::generate::{generate, GenerateParams};
use leanstream::engine::sample::{Sampler, SamplerConfig};
use leanstream::engine::{Arenas, EngineOptions};
use leanstream::load::open_model;
use leanstream::quant::{Packing, Precision};
use leanstream::serve::alloc_count::{self, CountingAllocator};
use leanstream::serve::server::{Server, ServerConfig};
use leanstream::sys;
use leanstream::tokenizer::chat::ChatFormat;
use leanstream::{log_error, log_info, log_warn};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[derive(Parser)]
#[command(
    name = "leanstreamd",
    version,
    about = "LeanStream inference daemon: OpenAI-compatible HTTP over a Unix socket"
)]
struct Args {
    /// GGUF file, llama2.c checkpoint, or flash image (`--image`: its FFN streams from disk).
    #[arg(long, alias = "image")]
    model: PathBuf,
    /// Unix socket path (default: the board's).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Tokenizer file, for llama2.c checkpoints.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    /// Client slots (default: the board's max_clients).
    #[arg(long)]
    max_clients: Option<usize>,
    /// Requests that may wait for the engine (default: the board's request_queue).
    #[arg(long)]
    queue: Option<usize>,
    /// A client must send its whole request within this many milliseconds (default: the board's).
    #[arg(long)]
    read_timeout_ms: Option<u64>,
    /// After SIGTERM, running and queued requests end within this many milliseconds (their
    /// answers end with finish_reason "length"); keep it below systemd's TimeoutStopSec.
    #[arg(long, default_value_t = 30_000)]
    shutdown_grace_ms: u64,
    /// KiB of each client slot's output buffer; a client that lets it stay full (it stopped
    /// reading) is cut off.
    #[arg(long, default_value_t = (board::DEFAULT_OUTBOX_BYTES / 1024) as u64, value_parser = clap::value_parser!(u64).range(4..=16384))]
    output_buffer_kib: u64,
    /// Context length in tokens (default: the smaller of the board's max_context and the
    /// model's own).
    #[arg(long)]
    context: Option<usize>,
    /// Log prompt text (off by default: prompts may be private).
    #[arg(long)]
    log_prompts: bool,
    /// Where to run: cpu, or cuda (an NVIDIA GPU and its driver).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// CUDA weights in `unified` (mapped host memory, as on a Jetson) or `discrete` (device)
    /// memory; default: the board's memory_model.
    #[arg(long)]
    memory: Option<String>,
    /// native (the file's own types, f16 KV; the default), f16, w8a8 or w4a8 (int8 KV).
    #[arg(long, default_value = "native", value_parser = Precision::parse)]
    precision: Precision,
    /// int4 packing (w4a8, and Q4_0 matrices at native): contiguous, interleaved, swizzled, or
    /// auto: the one this CPU decodes fastest in (swizzled with VNNI or on aarch64, interleaved
    /// on x86 without VNNI).
    #[arg(long, default_value = "auto", value_parser = parse_packing)]
    packing: Packing,
    /// KV layout policy for the int8 cache: adaptive, token-major or head-tiles.
    #[arg(long, default_value = "adaptive")]
    kv_layout: String,
    /// A kvcost table from `leanstream calibrate-kv` (default: built-in constants).
    #[arg(long)]
    kv_cost: Option<PathBuf>,
    #[command(flatten)]
    sparsity: leanstream::sparsity::cli::SparsityArgs,
    #[command(flatten)]
    stream: leanstream::engine::StreamArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => {
            log_info!("stopped");
            sys::log::flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Boot failures go straight to stderr as well: the logger may not be running.
            eprintln!("leanstreamd: {e}");
            log_error!("boot failed");
            sys::log::flush();
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    sys::signals::install_shutdown_handlers()
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    sys::log::start_logger().map_err(|e| format!("cannot start the logger: {e}"))?;
    sys::log::set_log_prompts(args.log_prompts);
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(board::SOCKET_PATH));

    let (file, tok) = open_model(&args.model, args.tokenizer.as_deref())?;
    let template = file
        .gguf()
        .and_then(|g| g.get_str("tokenizer.chat_template"));
    let chat = match ChatFormat::detect(template) {
        Ok(c) => c,
        Err(e) => {
            log_warn!("chat template not supported; /v1/chat/completions uses plain ChatML");
            eprintln!("leanstreamd: {e}; using ChatML for chat requests");
            ChatFormat::detect(None).map_err(|e| e.to_string())?
        }
    };
    let model_name = args
        .model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string());
    // The arenas live as long as the process: one static, initialised once at boot.
    static ARENAS: static_cell::StaticCell<Arenas> = static_cell::StaticCell::new();
    let arenas: &'static mut Arenas = ARENAS.init(Arenas::from_board().map_err(|e| e.to_string())?);
    // The I/O lanes' staging buffers and flags are owned from boot and must never be paged
    // out. Where the limit forbids locking them the daemon still serves (reads still land in
    // them; they may be paged out under pressure), and says so.
    if let Err(leanstream::boot::BootError::Lock { bytes, source, .. }) = arenas.lock_io() {
        log_warn!(
            "the I/O arenas are not locked in memory ({} bytes, errno {}): raise RLIMIT_MEMLOCK (LimitMEMLOCK= in the unit)",
            bytes,
            source.raw_os_error().unwrap_or(0) as i64
        );
    }
    let mut opts = EngineOptions {
        ffn: args.sparsity.single(&args.model, &file)?,
        ..Default::default()
    };
    if leanstream::model::flash::is_flash_image(&args.model) {
        opts.stream = Some(args.stream.options(&args.model)?);
    }
    if let Some(t) = args.threads {
        opts.threads = t;
    }
    if let Some(c) = args.context {
        opts.context = c;
    }
    opts.precision = args.precision;
    opts.packing = args.packing;
    opts.kv_policy = leanstream::kv::policy_from(&file, args.kv_cost.as_deref(), &args.kv_layout)?;
    let backend = Backend::parse(&args.backend)?;
    let mut cuda = CudaOptions::default();
    if let Some(m) = args.memory.as_deref() {
        cuda.memory = parse_memory(m)?;
    }
    let ffn_label = opts.ffn.label();
    let mut engine = AnyEngine::boot(arenas, &file, backend, opts, cuda).map_err(|e| match e {
        leanstream::engine::EngineError::Gpu(_) => e.to_string(),
        leanstream::engine::EngineError::Options(_) if backend == Backend::Cuda => e.to_string(),
        _ => format!("{}: {e}", args.model.display()),
    })?;
    if let (true, AnyEngine::Cpu(cpu)) = (args.precision != Precision::Native, &engine) {
        eprintln!(
            "leanstreamd: precision {}: {} | KV cache {}",
            args.precision,
            cpu.conversions,
            cpu.kv_description()
        );
    }
    drop(file);
    let idx = engine.take_sample_buffer().expect("fresh engine");
    let mut sampler = Sampler::new(SamplerConfig::default(), idx);

    // Warm up: one short generation touches every weight page and starts the workers.
    let warm = tok.encode("Hello", true);
    let params = GenerateParams {
        max_tokens: 2,
        stop: &[],
        deadline: None,
    };
    let warmed = generate(
        engine.decoder(),
        &mut sampler,
        &tok,
        &warm,
        &params,
        &mut |_| true,
    )
    .map_err(|e| e.to_string())?;
    if let Some(e) = warmed.error {
        return Err(format!(
            "{}: the FFN stream failed while warming up: {e}",
            args.model.display()
        ));
    }

    // Every slot and buffer the server makes is counted against the board's request-buffer
    // budget, however many slots were asked for.
    let max_clients = args.max_clients.unwrap_or(board::MAX_CLIENTS).max(1);
    let output_buffer_bytes = args.output_buffer_kib as usize * 1024;
    let need = leanstream::serve::server::memory_bytes(
        max_clients,
        board::MAX_REQUEST_BYTES,
        output_buffer_bytes,
        engine.decoder().context(),
    );
    if need > board::REQUEST_BUFFERS_BYTES {
        return Err(format!(
            "board '{}': {max_clients} client slots with {} KiB output buffers and the engine thread's request buffers need {need} bytes ({:.1} MiB) but budget.request_buffers is {} bytes ({:.1} MiB): lower --max-clients or --output-buffer-kib, or raise the budget",
            board::NAME,
            args.output_buffer_kib,
            need as f64 / 1048576.0,
            board::REQUEST_BUFFERS_BYTES,
            board::REQUEST_BUFFERS_BYTES as f64 / 1048576.0
        ));
    }
    let listener =
        sys::socket::bind_listener(&socket, board::SOCKET_MODE).map_err(|e| e.to_string())?;
    let watchdog = sys::notify::watchdog_interval();
    let last_ping = std::sync::Mutex::new(std::time::Instant::now());
    let on_tick = || {
        if let Some(every) = watchdog {
            let mut last = last_ping.lock().unwrap();
            if last.elapsed() >= every / 2 {
                let _ = sys::notify::watchdog();
                *last = std::time::Instant::now();
            }
        }
    };
    let on_ready = || {
        alloc_count::reset();
        alloc_count::arm();
        let _ = sys::notify::ready();
        log_info!("ready: serving on the socket");
    };
    let on_stop_accepting = || {
        // The listener is closed: remove its file so new clients fail at once, and tell
        // systemd we are stopping (the running request may take up to the grace).
        let _ = std::fs::remove_file(&socket);
        let _ = sys::notify::stopping();
    };
    let allocations = alloc_count::allocations_after_boot;
    let server = Server::new(ServerConfig {
        model_name: &model_name,
        allowed_uids: board::ALLOWED_UIDS,
        allowed_gids: board::ALLOWED_GIDS,
        max_clients,
        queue_depth: args.queue.unwrap_or(board::REQUEST_QUEUE).clamp(1, 64),
        max_request_bytes: board::MAX_REQUEST_BYTES,
        read_timeout: Duration::from_millis(args.read_timeout_ms.unwrap_or(board::READ_TIMEOUT_MS)),
        request_timeout: Duration::from_secs(board::REQUEST_TIMEOUT_S),
        shutdown_grace: Duration::from_millis(args.shutdown_grace_ms),
        output_buffer_bytes,
        shutdown: &sys::signals::shutdown_requested,
        on_tick: &on_tick,
        on_stop_accepting: &on_stop_accepting,
        allocations: &allocations,
        on_ready: &on_ready,
    });
    eprintln!(
        "leanstreamd: serving {} on {} (board {}, {}, ffn {})",
        model_name,
        socket.display(),
        board::NAME,
        engine.describe(),
        ffn_label
    );
    server.run(listener, engine.decoder(), &mut sampler, &tok, &chat);
    Ok(())
}
