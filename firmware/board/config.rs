//! The board config schema and its validator. This one file is compiled twice: by `build.rs`
//! (which refuses to build an invalid board and emits the consts) and by the unit tests.
//! It depends only on `serde` and `toml`.

use serde::Deserialize;
use std::fmt;

/// Arena alignment: a page, and the O_DIRECT alignment of every buffer that feeds the SSD.
pub const ARENA_ALIGN: u64 = 4096;
/// `sun_path` holds 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;
/// Most prompt tokens one batched prefill step may hold (the kernels' fixed per-token arrays).
pub const MAX_PREFILL_BATCH: u64 = 64;
/// Most prompt tokens one GPU prefill chunk may hold (its buffers come out of the activation
/// budget; engine/cuda_prefill.rs).
pub const MAX_GPU_PREFILL_BATCH: u64 = 4096;
/// Bytes of a client slot's output buffer by default (`leanstreamd --output-buffer-kib`).
pub const DEFAULT_OUTBOX_BYTES: u64 = 64 << 10;
/// Bytes a slot moves from its output buffer to its socket at once.
pub const SEND_CHUNK_BYTES: u64 = 4096;

/// What one client slot allocates at boot: its request and the request's validated text
/// (`max_request_bytes` each), its output buffer and its send chunk. The server's
/// `memory_bytes` adds the engine thread's buffers, which depend on the model.
pub fn slot_bytes(max_request_bytes: u64, outbox_bytes: u64) -> u64 {
    2 * max_request_bytes + outbox_bytes.max(1) + SEND_CHUNK_BYTES
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoardFile {
    pub board: Board,
    pub budget: Budget,
    pub limits: Limits,
    pub io: Io,
    pub socket: Socket,
    /// Where the controller writes its frequency caps (needed with `board.dvfs = true`).
    #[serde(default)]
    pub dvfs: Option<Dvfs>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Board {
    pub name: String,
    pub description: String,
    pub gpu_arch: String,
    pub memory_model: String,
    pub usable_memory: String,
    pub cpu_threads: i64,
    /// Whether the controller may cap GPU and memory clocks through sysfs (Jetson only).
    #[serde(default)]
    pub dvfs: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub dense_weights: String,
    pub ffn_cache: String,
    pub kv: String,
    pub activation_scratch: String,
    pub io_staging: String,
    pub flags: String,
    pub request_buffers: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_context: i64,
    pub max_clients: i64,
    pub max_request_bytes: i64,
    pub request_queue: i64,
    pub prefill_batch: i64,
    /// Prompt tokens a GPU prefill chunk holds; absent: `prefill_batch`. Apart from the CPU's
    /// because tensor cores want hundreds of tokens where the CPU's kernels hold 64 at most.
    #[serde(default)]
    pub gpu_prefill_batch: Option<i64>,
    pub read_timeout_ms: i64,
    pub request_timeout_s: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Io {
    pub lanes: i64,
    pub queue_depth: i64,
    pub block_align: i64,
    pub merge_blocks: i64,
}

/// A Jetson's clock caps in sysfs: files that take a frequency in Hz (devfreq's `max_freq`,
/// the EMC's cap). Read at boot (the caps to restore) and written when a plan's cap changes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dvfs {
    pub gpu_max_freq: String,
    pub emc_max_freq: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Socket {
    pub path: String,
    pub mode: i64,
    pub allowed_uids: Vec<i64>,
    pub allowed_gids: Vec<i64>,
}

/// A board that passed validation: every size in bytes, every count positive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidBoard {
    pub name: String,
    pub description: String,
    pub gpu_arch: &'static str,
    pub memory_model: &'static str,
    pub usable_memory: u64,
    pub cpu_threads: u64,
    pub dvfs: bool,
    /// With `dvfs`: the GPU's and the EMC's cap files (absolute paths under /sys); else empty.
    pub dvfs_gpu_max_freq: String,
    pub dvfs_emc_max_freq: String,
    /// (name, bytes) in declaration order: dense_weights, ffn_cache, kv, activation_scratch,
    /// io_staging, flags, request_buffers.
    pub budgets: [(&'static str, u64); 7],
    pub max_context: u64,
    pub max_clients: u64,
    pub max_request_bytes: u64,
    pub request_queue: u64,
    pub prefill_batch: u64,
    pub gpu_prefill_batch: u64,
    pub read_timeout_ms: u64,
    pub request_timeout_s: u64,
    pub io_lanes: u64,
    pub io_queue_depth: u64,
    pub io_block_align: u64,
    pub io_merge_blocks: u64,
    pub socket_path: String,
    pub socket_mode: u32,
    pub allowed_uids: Vec<u32>,
    pub allowed_gids: Vec<u32>,
}

/// A config error always names the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(field: &str, message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        field: field.to_string(),
        message: message.into(),
    })
}

/// Parses "512 MiB", "1 GiB", "64 KiB" or a plain byte count.
pub fn parse_size(field: &str, text: &str) -> Result<u64, ConfigError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return err(
            field,
            format!("'{text}' is not a size (write e.g. \"512 MiB\")"),
        );
    }
    let n: u64 = match digits.parse() {
        Ok(n) => n,
        Err(_) => return err(field, format!("'{text}' is too large")),
    };
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return err(
                field,
                format!("unknown unit '{other}' (use B, KiB, MiB or GiB)"),
            )
        }
    };
    match n.checked_mul(mult) {
        Some(v) => Ok(v),
        None => err(field, format!("'{text}' overflows 64 bits")),
    }
}

fn positive(field: &str, v: i64) -> Result<u64, ConfigError> {
    if v <= 0 {
        return err(field, format!("must be positive, got {v}"));
    }
    Ok(v as u64)
}

fn id_list(field: &str, ids: &[i64]) -> Result<Vec<u32>, ConfigError> {
    ids.iter()
        .map(|&id| match u32::try_from(id) {
            Ok(v) => Ok(v),
            Err(_) => err(field, format!("{id} is not a valid id")),
        })
        .collect()
}

/// Parses and validates a board config file.
pub fn parse_board(text: &str) -> Result<ValidBoard, ConfigError> {
    let file: BoardFile = match toml::from_str(text) {
        Ok(f) => f,
        Err(e) => return err("toml", e.to_string()),
    };
    validate(&file)
}

pub fn validate(f: &BoardFile) -> Result<ValidBoard, ConfigError> {
    let b = &f.board;
    if b.name.is_empty()
        || !b
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return err(
            "board.name",
            format!("'{}' must be non-empty [A-Za-z0-9_-]", b.name),
        );
    }
    let gpu_arch: &'static str = match b.gpu_arch.as_str() {
        "none" => "none",
        "sm_72" => "sm_72",
        "sm_87" => "sm_87",
        "sm_90" => "sm_90",
        other => {
            return err(
                "board.gpu_arch",
                format!("'{other}' is not one of none, sm_72, sm_87, sm_90"),
            )
        }
    };
    let memory_model: &'static str = match b.memory_model.as_str() {
        "none" => "none",
        "unified" => "unified",
        "discrete" => "discrete",
        other => {
            return err(
                "board.memory_model",
                format!("'{other}' is not one of none, unified, discrete"),
            )
        }
    };
    if (gpu_arch == "none") != (memory_model == "none") {
        return err(
            "board.memory_model",
            format!("'{memory_model}' does not go with gpu_arch '{gpu_arch}': a board without a GPU has memory_model \"none\", a board with one \"unified\" or \"discrete\""),
        );
    }
    let usable_memory = parse_size("board.usable_memory", &b.usable_memory)?;
    if usable_memory == 0 {
        return err("board.usable_memory", "must be positive");
    }
    let cpu_threads = positive("board.cpu_threads", b.cpu_threads)?;
    if cpu_threads > 256 {
        return err(
            "board.cpu_threads",
            format!("{cpu_threads} is more than 256"),
        );
    }

    // Clocks are a Jetson's to change (devfreq in sysfs, one memory for CPU and GPU); a
    // discrete GPU's clocks and a host's stay as they are.
    if b.dvfs && !(memory_model == "unified" && matches!(gpu_arch, "sm_72" | "sm_87")) {
        return err(
            "board.dvfs",
            format!("dvfs is for a Jetson (gpu_arch sm_72 or sm_87, memory_model \"unified\"), not gpu_arch \"{gpu_arch}\" with memory_model \"{memory_model}\""),
        );
    }
    let (dvfs_gpu_max_freq, dvfs_emc_max_freq) = match (&f.dvfs, b.dvfs) {
        (_, false) => (String::new(), String::new()),
        (None, true) => {
            return err(
                "dvfs",
                "board.dvfs = true needs a [dvfs] section: gpu_max_freq and emc_max_freq, the sysfs files of the caps",
            )
        }
        (Some(d), true) => {
            for (field, path) in [
                ("dvfs.gpu_max_freq", &d.gpu_max_freq),
                ("dvfs.emc_max_freq", &d.emc_max_freq),
            ] {
                if !path.starts_with("/sys/") || path.contains("..") {
                    return err(
                        field,
                        format!("'{path}' is not a file under /sys/"),
                    );
                }
            }
            (d.gpu_max_freq.clone(), d.emc_max_freq.clone())
        }
    };

    let g = &f.budget;
    let named = [
        ("dense_weights", &g.dense_weights),
        ("ffn_cache", &g.ffn_cache),
        ("kv", &g.kv),
        ("activation_scratch", &g.activation_scratch),
        ("io_staging", &g.io_staging),
        ("flags", &g.flags),
        ("request_buffers", &g.request_buffers),
    ];
    let mut budgets = [("", 0u64); 7];
    let mut total: u64 = 0;
    for (i, (name, text)) in named.iter().enumerate() {
        let field = format!("budget.{name}");
        let bytes = parse_size(&field, text)?;
        if bytes == 0 {
            return err(&field, "must be positive");
        }
        if bytes % ARENA_ALIGN != 0 {
            return err(
                &field,
                format!("{bytes} bytes is not a multiple of {ARENA_ALIGN} (arena alignment)"),
            );
        }
        total = total.saturating_add(bytes);
        budgets[i] = (name, bytes);
    }
    if total > usable_memory {
        return err(
            "budget",
            format!("the budgets add up to {total} bytes, more than board.usable_memory ({usable_memory} bytes)"),
        );
    }

    let l = &f.limits;
    let max_context = positive("limits.max_context", l.max_context)?;
    if max_context < 16 {
        return err(
            "limits.max_context",
            format!("{max_context} tokens is too small (at least 16)"),
        );
    }
    let max_clients = positive("limits.max_clients", l.max_clients)?;
    let max_request_bytes = positive("limits.max_request_bytes", l.max_request_bytes)?;
    if max_request_bytes < 1024 {
        return err(
            "limits.max_request_bytes",
            format!("{max_request_bytes} is too small (at least 1024)"),
        );
    }
    let request_queue = positive("limits.request_queue", l.request_queue)?;
    if request_queue > 64 {
        return err(
            "limits.request_queue",
            format!("{request_queue} is more than 64"),
        );
    }
    let prefill_batch = positive("limits.prefill_batch", l.prefill_batch)?;
    if prefill_batch > MAX_PREFILL_BATCH {
        return err(
            "limits.prefill_batch",
            format!("{prefill_batch} is more than {MAX_PREFILL_BATCH}"),
        );
    }
    let gpu_prefill_batch = match l.gpu_prefill_batch {
        Some(n) => positive("limits.gpu_prefill_batch", n)?,
        None => prefill_batch,
    };
    if gpu_prefill_batch > MAX_GPU_PREFILL_BATCH {
        return err(
            "limits.gpu_prefill_batch",
            format!("{gpu_prefill_batch} is more than {MAX_GPU_PREFILL_BATCH}"),
        );
    }
    let read_timeout_ms = positive("limits.read_timeout_ms", l.read_timeout_ms)?;
    let request_timeout_s = positive("limits.request_timeout_s", l.request_timeout_s)?;
    let request_buffers = budgets[6].1;
    let per_slot = slot_bytes(max_request_bytes, DEFAULT_OUTBOX_BYTES);
    let needed = max_clients.saturating_mul(per_slot);
    if needed > request_buffers {
        return err(
            "budget.request_buffers",
            format!("{request_buffers} bytes cannot hold max_clients ({max_clients}) slots of {per_slot} bytes (2 x max_request_bytes + the output buffer and send chunk) = {needed}"),
        );
    }

    let io_lanes = positive("io.lanes", f.io.lanes)?;
    let io_queue_depth = positive("io.queue_depth", f.io.queue_depth)?;
    let io_block_align = positive("io.block_align", f.io.block_align)?;
    let io_merge_blocks = positive("io.merge_blocks", f.io.merge_blocks)?;
    if io_merge_blocks > io_queue_depth {
        return err(
            "io.merge_blocks",
            format!("{io_merge_blocks} must be at most io.queue_depth ({io_queue_depth}): a merged read takes that many of a lane's buffers"),
        );
    }
    if !io_block_align.is_power_of_two()
        || io_block_align < 512
        || !ARENA_ALIGN.is_multiple_of(io_block_align)
    {
        return err(
            "io.block_align",
            format!("{io_block_align} must be a power of two between 512 and {ARENA_ALIGN}"),
        );
    }

    let s = &f.socket;
    if !s.path.starts_with('/') {
        return err(
            "socket.path",
            format!("'{}' must be an absolute path", s.path),
        );
    }
    if s.path.len() > MAX_SOCKET_PATH {
        return err(
            "socket.path",
            format!(
                "{} bytes is longer than a Unix socket path may be ({MAX_SOCKET_PATH})",
                s.path.len()
            ),
        );
    }
    if !(0..=0o777).contains(&s.mode) {
        return err(
            "socket.mode",
            format!("{:o} is not a permission mode (0o000..0o777)", s.mode),
        );
    }
    if s.mode & 0o007 != 0 {
        return err(
            "socket.mode",
            format!(
                "{:o} lets every local user connect: clear the 'other' bits",
                s.mode
            ),
        );
    }
    let allowed_uids = id_list("socket.allowed_uids", &s.allowed_uids)?;
    let allowed_gids = id_list("socket.allowed_gids", &s.allowed_gids)?;
    if allowed_uids.is_empty() && allowed_gids.is_empty() {
        return err(
            "socket.allowed_uids",
            "no uid or gid may connect: list at least one",
        );
    }

    Ok(ValidBoard {
        name: b.name.clone(),
        description: b.description.clone(),
        gpu_arch,
        memory_model,
        usable_memory,
        cpu_threads,
        dvfs: b.dvfs,
        dvfs_gpu_max_freq,
        dvfs_emc_max_freq,
        budgets,
        max_context,
        max_clients,
        max_request_bytes,
        request_queue,
        prefill_batch,
        gpu_prefill_batch,
        read_timeout_ms,
        request_timeout_s,
        io_lanes,
        io_queue_depth,
        io_block_align,
        io_merge_blocks,
        socket_path: s.path.clone(),
        socket_mode: s.mode as u32,
        allowed_uids,
        allowed_gids,
    })
}

/// The Rust source of the board's consts, written by build.rs into `$OUT_DIR/board.rs`.
pub fn emit_consts(v: &ValidBoard) -> String {
    let mut s = String::new();
    s.push_str("// Generated by build.rs from the board config. Do not edit.\n");
    s.push_str(&format!("pub const NAME: &str = {:?};\n", v.name));
    s.push_str(&format!(
        "pub const DESCRIPTION: &str = {:?};\n",
        v.description
    ));
    let arch = match v.gpu_arch {
        "sm_72" => "Sm72",
        "sm_87" => "Sm87",
        "sm_90" => "Sm90",
        _ => "None",
    };
    s.push_str(&format!("pub const GPU_ARCH: GpuArch = GpuArch::{arch};\n"));
    let mm = match v.memory_model {
        "unified" => "Unified",
        "discrete" => "Discrete",
        _ => "None",
    };
    s.push_str(&format!(
        "pub const MEMORY_MODEL: MemoryModel = MemoryModel::{mm};\n"
    ));
    s.push_str(&format!(
        "pub const USABLE_MEMORY_BYTES: usize = {};\n",
        v.usable_memory
    ));
    s.push_str(&format!(
        "pub const CPU_THREADS: usize = {};\n",
        v.cpu_threads
    ));
    s.push_str(&format!("pub const DVFS: bool = {};\n", v.dvfs));
    s.push_str(&format!(
        "pub const DVFS_GPU_MAX_FREQ: &str = {:?};\n",
        v.dvfs_gpu_max_freq
    ));
    s.push_str(&format!(
        "pub const DVFS_EMC_MAX_FREQ: &str = {:?};\n",
        v.dvfs_emc_max_freq
    ));
    for (name, bytes) in v.budgets.iter() {
        s.push_str(&format!(
            "pub const {}_BYTES: usize = {};\n",
            name.to_uppercase(),
            bytes
        ));
    }
    s.push_str(&format!(
        "pub const MAX_CONTEXT: usize = {};\n",
        v.max_context
    ));
    s.push_str(&format!(
        "pub const MAX_CLIENTS: usize = {};\n",
        v.max_clients
    ));
    s.push_str(&format!(
        "pub const MAX_REQUEST_BYTES: usize = {};\n",
        v.max_request_bytes
    ));
    s.push_str(&format!(
        "pub const REQUEST_QUEUE: usize = {};\n",
        v.request_queue
    ));
    s.push_str(&format!(
        "pub const PREFILL_BATCH: usize = {};\n",
        v.prefill_batch
    ));
    s.push_str(&format!(
        "pub const GPU_PREFILL_BATCH: usize = {};\n",
        v.gpu_prefill_batch
    ));
    s.push_str(&format!(
        "pub const READ_TIMEOUT_MS: u64 = {};\n",
        v.read_timeout_ms
    ));
    s.push_str(&format!(
        "pub const REQUEST_TIMEOUT_S: u64 = {};\n",
        v.request_timeout_s
    ));
    s.push_str(&format!(
        "pub const DEFAULT_OUTBOX_BYTES: usize = {DEFAULT_OUTBOX_BYTES};\n"
    ));
    s.push_str(&format!(
        "pub const SEND_CHUNK_BYTES: usize = {SEND_CHUNK_BYTES};\n"
    ));
    s.push_str(&format!("pub const IO_LANES: usize = {};\n", v.io_lanes));
    s.push_str(&format!(
        "pub const IO_QUEUE_DEPTH: usize = {};\n",
        v.io_queue_depth
    ));
    s.push_str(&format!(
        "pub const IO_BLOCK_ALIGN: usize = {};\n",
        v.io_block_align
    ));
    s.push_str(&format!(
        "pub const IO_MERGE_BLOCKS: usize = {};\n",
        v.io_merge_blocks
    ));
    s.push_str(&format!(
        "pub const SOCKET_PATH: &str = {:?};\n",
        v.socket_path
    ));
    s.push_str(&format!(
        "pub const SOCKET_MODE: u32 = 0o{:o};\n",
        v.socket_mode
    ));
    s.push_str(&format!(
        "pub const ALLOWED_UIDS: &[u32] = &{:?};\n",
        v.allowed_uids
    ));
    s.push_str(&format!(
        "pub const ALLOWED_GIDS: &[u32] = &{:?};\n",
        v.allowed_gids
    ));
    s
}
