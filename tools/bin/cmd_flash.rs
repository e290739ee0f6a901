//! `leanstream flash`: a GGUF written as a flash image for a board
//! (`leanstream_tools::offline::flash`; the format is `leanstream::model::flash`).

use super::*;
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions};
use leanstream_tools::offline::placement::{Active, PlacementKind};

#[derive(Args)]
pub struct FlashArgs {
    /// The GGUF to write as an image.
    model: PathBuf,
    /// The board the image is for: a name of board-configs/*.toml (any board, not only the
    /// one this build is for).
    #[arg(long)]
    board: String,
    /// native (the file's own types), w8a8 or w4a8 (as `requant` converts them).
    #[arg(long, default_value = "native", value_parser = Precision::parse)]
    precision: Precision,
    /// identity (model order), greedy or coact (both by co-activation; need --trace).
    #[arg(long, default_value = "identity", value_parser = PlacementKind::parse)]
    placement: PlacementKind,
    /// A thresholds table (`leanstream calibrate`) to carry in the image.
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// An activation trace (`leanstream trace`) to place by (greedy, coact) and to measure the
    /// placement on: blocks read per token, bytes read per useful neuron.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// A trace of other text to measure the placement on (held out from placing it).
    #[arg(long, value_name = "TRACE")]
    eval_trace: Option<PathBuf>,
    /// Which of the trace's neurons count as active: all but this fraction, by |SiLU(gate) *
    /// up| (with --thresholds holding this sparsity: the calibrated thresholds instead of a
    /// per-token top-k). Default: the trace's own sparsity, else 0.8.
    #[arg(long, value_name = "S")]
    active_sparsity: Option<f32>,
    /// Read units per block: 1 fills one read unit with as many bundles as fit; N > 1 makes
    /// larger blocks of more bundles (for models whose one bundle nearly fills a read unit).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    block_units: u32,
    /// With --placement coact: chain its blocks so co-active ones sit side by side for merged
    /// reads of N adjacent blocks (the board's `io.merge_blocks`). Default: the clustering's
    /// order, hottest first (it read less on the real models measured). The cost line counts
    /// reads as the board's lanes merge them either way.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    run_blocks: Option<u32>,
    /// Where to write it (default: <model stem>.<board>.<precision>.flash beside the model).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn cmd_flash(a: FlashArgs) -> Result<(), String> {
    let board = BoardTarget::load(&a.board)?;
    if a.precision == Precision::F16 {
        return Err("--precision: flash writes native, w8a8 or w4a8".into());
    }
    let out = a.out.clone().unwrap_or_else(|| {
        let stem = a.model.file_stem().unwrap_or_default().to_string_lossy();
        a.model
            .with_file_name(format!("{stem}.{}.{}.flash", board.name, a.precision))
    });
    let sparsity = match (a.active_sparsity, &a.trace) {
        (Some(s), _) => s,
        (None, Some(t)) => leanstream_tools::offline::trace::TraceReader::open(t)?
            .meta("sparsity")
            .and_then(|s| s.parse::<f32>().ok())
            .filter(|&s| s > 0.0)
            .unwrap_or(0.8),
        (None, None) => 0.8,
    };
    leanstream::sparsity::check_sparsity(sparsity)?;
    let active = match &a.thresholds {
        Some(p) if a.trace.is_some() || a.eval_trace.is_some() => {
            let file =
                ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
            match ThresholdTable::load(p, &file)?.thresholds(sparsity, Score::Glu) {
                Ok(t) => Active::Threshold(t),
                Err(_) => Active::TopK {
                    keep: 1.0 - sparsity,
                },
            }
        }
        _ => Active::TopK {
            keep: 1.0 - sparsity,
        },
    };
    let o = FlashOptions {
        board,
        precision: a.precision,
        placement: a.placement,
        thresholds: a.thresholds.clone(),
        trace: a.trace.clone(),
        eval_trace: a.eval_trace.clone(),
        active: active.clone(),
        block_units: a.block_units as usize,
        run_blocks: a.run_blocks.map(|r| r as usize),
    };
    // A bar on a terminal (indicatif draws nothing when stderr is not one).
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("flash {bar:40} layer {pos}/{len} {elapsed}")
            .expect("a valid template"),
    );
    let r = write_image(&a.model, &out, &o, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let r = r?;
    let mib = |b: u64| b as f64 / 1048576.0;
    let h = &r.header;
    eprintln!(
        "flash: {} -> {} ({:.1} MiB) for board {}, precision {}, placement {}",
        a.model.display(),
        out.display(),
        mib(r.file_bytes),
        h.board,
        h.precision,
        h.placement
    );
    let ks = h.layers.iter().map(|g| g.per_block);
    if let (Some(lo), Some(hi)) = (ks.clone().min(), ks.max()) {
        if lo != hi {
            eprintln!("  layers differ (the first and last keep more bits at w4a8): k from {lo} to {hi}; layer 0:");
        }
    }
    if let Some(g) = h.layers.first() {
        let (gb, ub, db) = g.part_bytes().unwrap_or_default();
        let (gt, ut, dt) = g.types().expect("written types");
        eprintln!(
            "  FFN: {} layers x {} blocks of {} bytes, k = {} bundles a block ({} {} + {} {} + {} {} = {} bytes; {:.0}% of a block used), {:.1} MiB",
            h.layers.len(),
            g.blocks,
            g.block_bytes,
            g.per_block,
            gt.name(),
            gb,
            ut.name(),
            ub,
            dt.name(),
            db,
            gb + ub + db,
            100.0 * (g.per_block as usize * (gb + ub + db)) as f64 / g.block_bytes as f64,
            mib(r.ffn_bytes)
        );
    }
    eprintln!(
        "  dense part: {:.1} MiB (the engine's dense_weights arena: {:.1} MiB); minimum cache (one layer's blocks): {:.1} MiB",
        mib(r.dense_bytes),
        mib(r.dense_arena),
        mib(r.min_cache)
    );
    if let Some((id, placed)) = r.costs {
        let rule = match &active {
            Active::TopK { keep } => format!("top {:.0}% per token", 100.0 * keep),
            Active::Threshold(_) => format!("calibrated thresholds at sparsity {sparsity}"),
        };
        eprintln!(
            "  on the {} ({rule}; {:.0} neurons per token): identity {:.1} blocks/token, {:.1} reads/token (merging {}), {:.0} bytes per useful neuron; {} {:.1} blocks/token, {:.1} reads/token, {:.0} bytes per useful neuron",
            if a.eval_trace.is_some() {
                "evaluation trace"
            } else {
                "trace"
            },
            id.useful_per_token,
            id.blocks_per_token,
            id.reads_per_token,
            id.run,
            id.bytes_per_useful_neuron,
            h.placement,
            placed.blocks_per_token,
            placed.reads_per_token,
            placed.bytes_per_useful_neuron
        );
    }
    println!("{}", out.display());
    Ok(())
}
