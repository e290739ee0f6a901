//! `leanstream board [--model M]`: every byte the daemon owns on this image's board, from the
//! board config, and who owns it; with a model, what booting it takes of each engine arena at
//! each precision, and whether it fits.

use clap::Args;
use leanstream::board;
use leanstream::boot::ArenaKind;
use leanstream::engine::{Engine, EngineOptions};
use leanstream::model::ModelFile;
use leanstream::quant::Precision;
use std::path::PathBuf;

#[derive(Args)]
pub struct BoardArgs {
    /// Also plan this model on the board: what it needs of each engine arena.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Precisions to plan the model at (comma-separated; default: every one).
    #[arg(long, value_delimiter = ',', value_parser = Precision::parse)]
    precision: Vec<Precision>,
    /// Context to plan the KV cache for (default: the smaller of the board's and the model's).
    #[arg(long, default_value_t = 0)]
    context: usize,
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

pub fn run(a: BoardArgs) -> Result<(), String> {
    println!("board {}: {}", board::NAME, board::DESCRIPTION);
    println!(
        "GPU: {:?}, memory model {:?} (PTX for every GPU is embedded; the board picks the defaults)",
        board::GPU_ARCH,
        board::MEMORY_MODEL
    );
    let total: usize = ArenaKind::ALL.iter().map(|k| k.board_budget()).sum();
    println!(
        "usable memory {}; the budgets below take {} of it",
        mib(board::USABLE_MEMORY_BYTES),
        mib(total)
    );
    println!();
    println!("| budget | bytes | owner: what it holds |");
    println!("|---|---|---|");
    for k in ArenaKind::ALL {
        println!(
            "| {} | {} ({}) | {} |",
            k.field(),
            k.board_budget(),
            mib(k.board_budget()),
            k.owner()
        );
    }
    println!();
    println!(
        "limits: context {} tokens, {} client slots of {} request bytes, queue {}, prefill batch {} (GPU {}), {} CPU threads",
        board::MAX_CONTEXT,
        board::MAX_CLIENTS,
        board::MAX_REQUEST_BYTES,
        board::REQUEST_QUEUE,
        board::PREFILL_BATCH,
        board::GPU_PREFILL_BATCH,
        board::CPU_THREADS
    );
    println!(
        "I/O: {} lanes x {} reads in flight, {}-byte blocks; socket {} (mode {:o})",
        board::IO_LANES,
        board::IO_QUEUE_DEPTH,
        board::IO_BLOCK_ALIGN,
        board::SOCKET_PATH,
        board::SOCKET_MODE
    );
    let Some(path) = a.model else {
        return Ok(());
    };
    let file = ModelFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let precisions = if a.precision.is_empty() {
        Precision::ALL.to_vec()
    } else {
        a.precision
    };
    println!();
    println!(
        "{} on board {} (engine arenas, CPU backend):",
        path.display(),
        board::NAME
    );
    println!();
    println!("| precision | dense_weights | ffn_cache | kv | activation_scratch | boots |");
    println!("|---|---|---|---|---|---|");
    for p in precisions {
        let opts = EngineOptions {
            precision: p,
            context: a.context,
            ..EngineOptions::default()
        };
        let plan = Engine::plan(&file, &opts).map_err(|e| e.to_string())?;
        let mut cells = Vec::new();
        let mut short = Vec::new();
        for (kind, bytes, what) in plan.parts() {
            cells.push(mib(bytes));
            if bytes > kind.board_budget() {
                short.push(format!(
                    "{what} needs {} more than {}",
                    mib(bytes - kind.board_budget()),
                    kind.field()
                ));
            }
        }
        let verdict = if short.is_empty() {
            format!("yes ({} tokens of context)", plan.shape.context)
        } else {
            format!("no: {}", short.join("; "))
        };
        println!("| {p} | {} | {verdict} |", cells.join(" | "));
    }
    Ok(())
}
