//! `leanstream train-baseline` (the DejaVu and BNN predictors, `offline::train_mlp`) and
//! `leanstream train-eviction` (the learned cache policy's reuse-distance table,
//! `offline::train_evict`), on the same traces and labels as `train-predictor`.

use super::cmd_train_predictor::{model_name, open_traced, oracle_thresholds};
use super::*;
use leanstream_tools::offline::placement::{Active, ActiveSets};
use leanstream_tools::offline::train::data::parse_input;
use leanstream_tools::offline::train::TrainOptions;
use leanstream_tools::offline::train_evict::{train_eviction, AccessStream, EvictOptions};
use leanstream_tools::offline::train_mlp::{train_mlp, MlpOptions};

#[derive(Args)]
pub struct TrainBaselineArgs {
    /// The model the trace was recorded from (its identity goes into the table).
    #[arg(long)]
    model: PathBuf,
    /// The training trace (`leanstream trace`).
    #[arg(long)]
    trace: PathBuf,
    /// Thresholds table (default as for train-predictor).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// dejavu (a low-rank MLP on the layer's FFN input), dejavu-stale (on the previous
    /// layer's), or bnn (a binarized MLP on the layer's).
    #[arg(long)]
    kind: String,
    /// The oracle's sparsity the labels are made at.
    #[arg(long, default_value_t = 0.5)]
    sparsity: f32,
    /// Hidden units.
    #[arg(long, default_value_t = 128)]
    rank: usize,
    /// Passes over the training tokens.
    #[arg(long, default_value_t = 20)]
    epochs: usize,
    /// Samples per optimizer step.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 0.003)]
    lr: f64,
    /// The seed of every random choice (the same seed gives the same table).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Each layer reads the fewest top-scored neurons whose mean recall of the oracle set on
    /// the training tokens reaches this.
    #[arg(long, default_value_t = 0.9)]
    target_recall: f32,
    /// The table to write (`mlppred`).
    #[arg(long)]
    out: PathBuf,
}

pub fn cmd_train_baseline(a: TrainBaselineArgs) -> Result<(), String> {
    leanstream::sparsity::check_sparsity(a.sparsity)?;
    let (binary, input) = match a.kind.as_str() {
        "dejavu" => (false, "ffn-input"),
        "dejavu-stale" => (false, "prev-ffn-input"),
        "bnn" => (true, "ffn-input"),
        k => return Err(format!("--kind {k}: expected dejavu, dejavu-stale or bnn")),
    };
    let (file, id, trace) = open_traced(&a.model, &a.trace)?;
    let thresholds = oracle_thresholds(&a.model, &file, a.thresholds.clone(), a.sparsity)?;
    let o = MlpOptions {
        sparsity: a.sparsity,
        rank: a.rank,
        binary,
        input: parse_input(input)?,
        epochs: a.epochs,
        batch: a.batch,
        lr: a.lr,
        seed: a.seed,
        target_recall: a.target_recall,
    };
    let started = Instant::now();
    let table = train_mlp(
        &trace,
        &model_name(&a.model),
        &thresholds,
        &o,
        &mut |l, first, last, read, recall| {
            eprintln!(
                "train-baseline: layer {l}: loss {first:.4} -> {last:.4}, reads {read} for recall {recall:.3} ({:.0} s)",
                started.elapsed().as_secs_f64()
            )
        },
    )?;
    let bytes = table.encode(id);
    std::fs::write(&a.out, &bytes).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let model_bytes = std::fs::metadata(&a.model).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {} ({}): {} layers, {} bytes in memory ({:.2}% of the model file)",
        a.out.display(),
        table.name(),
        table.layers.len(),
        table.bytes(),
        100.0 * table.bytes() as f64 / model_bytes.max(1) as f64
    );
    Ok(())
}

#[derive(Args)]
pub struct TrainEvictionArgs {
    /// The model the trace was recorded from (its identity goes into the table).
    #[arg(long)]
    model: PathBuf,
    /// The training trace (`leanstream trace`); its active sets make the access stream.
    #[arg(long)]
    trace: PathBuf,
    /// Neurons active per token: all but this fraction, by |SiLU(gate) * up| per layer (as
    /// `cache-sim` takes them).
    #[arg(long, default_value_t = 0.8)]
    sparsity: f32,
    /// The access stream: per-layer (one cache per layer, as cache-sim) or runtime (one cache
    /// for all layers, as the streaming engine).
    #[arg(long, default_value = "per-layer")]
    stream: String,
    /// Bits of a bin's index (2^bits equal-probability bins of reuse distance).
    #[arg(long, default_value_t = 4)]
    code_bits: usize,
    /// Hashing layers (first, middle ones, last).
    #[arg(long, default_value_t = 3)]
    depth: usize,
    /// Heads per hashing layer (d = 64 * heads bits between layers).
    #[arg(long, default_value_t = 2)]
    heads: usize,
    /// Bits per hash.
    #[arg(long, default_value_t = 8)]
    tau: usize,
    /// Heads of the last layer (each votes for a bit of the bin index).
    #[arg(long, default_value_t = 4)]
    out_heads: usize,
    /// Bits per hash of the last layer.
    #[arg(long, default_value_t = 8)]
    out_tau: usize,
    /// Passes over the training tokens.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Samples per optimizer step.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f64,
    /// Most accesses trained on (drawn at random from the stream).
    #[arg(long, default_value_t = 200_000)]
    max_samples: usize,
    /// The seed of every random choice (the same seed gives the same table).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The table to write (`reuse`).
    #[arg(long)]
    out: PathBuf,
}

pub fn cmd_train_eviction(a: TrainEvictionArgs) -> Result<(), String> {
    if !(0.0..1.0).contains(&a.sparsity) {
        return Err(format!("--sparsity {} is not in [0, 1)", a.sparsity));
    }
    let (_, id, trace) = open_traced(&a.model, &a.trace)?;
    let active = ActiveSets::from_trace(
        &trace,
        &Active::TopK {
            keep: 1.0 - a.sparsity,
        },
    )?;
    let o = EvictOptions {
        stream: AccessStream::parse(&a.stream)?,
        code_bits: a.code_bits,
        max_samples: a.max_samples,
        train: TrainOptions {
            depth: a.depth,
            heads: a.heads,
            tau: a.tau,
            out_heads: a.out_heads,
            out_tau: a.out_tau,
            pca: 1.0,
            epochs: a.epochs,
            batch: a.batch,
            lr: a.lr,
            seed: a.seed,
            ..TrainOptions::default()
        },
    };
    let started = Instant::now();
    let (table, first, last, right) = train_eviction(&active, &model_name(&a.model), &o)?;
    std::fs::write(&a.out, table.encode(id)).map_err(|e| format!("{}: {e}", a.out.display()))?;
    println!(
        "wrote {}: {} ({}); loss {first:.4} -> {last:.4}, right bin for {:.1}% of the samples, bins {:?} tokens ({:.0} s)",
        a.out.display(),
        table.trained_on,
        o.stream.name(),
        100.0 * right,
        table.distance,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
