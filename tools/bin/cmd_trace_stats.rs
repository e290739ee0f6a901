//! `leanstream trace-stats`: a trace's statistics (`leanstream_tools::offline::trace_stats`).

use super::*;

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
