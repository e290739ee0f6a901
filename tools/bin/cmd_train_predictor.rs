//! `leanstream train-predictor` and `leanstream predictor-report`: the stacked learnable
//! hashing predictor trained on a trace (`leanstream_tools::offline::train`), and predictors
//! measured on a held-out trace (`leanstream_tools::offline::predictor_report`).

use super::*;
use leanstream::predict::hash::HashPredictorTable;
use leanstream_tools::offline::trace::TraceReader;
use leanstream_tools::offline::train::{self, data::parse_input, TrainOptions};

#[derive(Args)]
pub struct TrainPredictorArgs {
    /// The model the trace was recorded from (its identity goes into the table).
    #[arg(long)]
    model: PathBuf,
    /// The training trace (`leanstream trace`; one stage is enough).
    #[arg(long)]
    trace: PathBuf,
    /// Thresholds table (default: tables/<model file stem>.thresh in the working directory,
    /// beside the model, or in the repository).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// The oracle's sparsity the labels are made at (must be in the thresholds table).
    #[arg(long, default_value_t = 0.5)]
    sparsity: f32,
    /// Hashing layers per net (first, middle ones, last).
    #[arg(long, default_value_t = 5)]
    depth: usize,
    /// Bits per hash.
    #[arg(long, default_value_t = 8)]
    tau: usize,
    /// Heads per hashing layer (d = 64 * heads bits between layers).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Heads of the last layer (a neuron's score is how many vote for it).
    #[arg(long, default_value_t = 4)]
    out_heads: usize,
    /// Bits per hash of the last layer (2^out_tau rows of one bit per neuron, per head).
    #[arg(long, default_value_t = 8)]
    out_tau: usize,
    /// The share of the input's dimensions the PCA keeps.
    #[arg(long, default_value_t = 0.3)]
    pca: f32,
    /// Passes over the training tokens.
    #[arg(long, default_value_t = 20)]
    epochs: usize,
    /// Tokens per optimizer step.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f64,
    /// The gumbel-softmax's temperature.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// The seed of every random choice (the same seed gives the same table).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Each layer reads the fewest top-scored neurons whose mean recall of the oracle set on
    /// the training tokens reaches this.
    #[arg(long, default_value_t = 0.9)]
    target_recall: f32,
    /// What the predictor reads: ffn-input, residual, or prev-residual.
    #[arg(long, default_value = "ffn-input")]
    input: String,
    /// The output heads' votes: spread (head h votes at probability (h + 1/2) / heads, the
    /// score is a quantized probability) or half (every head at 1/2).
    #[arg(long, default_value = "spread")]
    votes: String,
    /// Train only these layers (comma-separated) and print how they do; writes no table.
    #[arg(long)]
    probe: Option<String>,
    /// Train nothing: take this trained table and set its read counts again for
    /// --target-recall on --trace (at the table's own sparsity); the shape and training
    /// options are the table's.
    #[arg(long)]
    from: Option<PathBuf>,
    /// The table to write (tables/<model>.hashpred by convention).
    #[arg(long)]
    out: PathBuf,
}

/// The model file, its identity, and a trace checked to come from it.
pub(super) fn open_traced(
    model: &Path,
    trace: &Path,
) -> Result<(ModelFile, u64, TraceReader), String> {
    let file = ModelFile::open(model).map_err(|e| format!("{}: {e}", model.display()))?;
    let id = leanstream::tables::model_identity(&file);
    let trace_reader = TraceReader::open(trace)?;
    if trace_reader.meta("identity") != Some(format!("{id:016x}").as_str()) {
        return Err(format!(
            "{} was traced from another model ({}, identity {}; {} is {id:016x})",
            trace.display(),
            trace_reader.meta("model").unwrap_or("?"),
            trace_reader.meta("identity").unwrap_or("?"),
            model.display()
        ));
    }
    Ok((file, id, trace_reader))
}

pub(super) fn oracle_thresholds(
    model: &Path,
    file: &ModelFile,
    path: Option<PathBuf>,
    sparsity: f32,
) -> Result<Vec<f32>, String> {
    let path = match path {
        Some(p) => p,
        None => find_default(model)?,
    };
    let table = ThresholdTable::load(&path, file)?;
    leanstream_tools::offline::oracle::thresholds(&table, sparsity)
}

pub(super) fn model_name(model: &Path) -> String {
    model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn cmd_train_predictor(a: TrainPredictorArgs) -> Result<(), String> {
    if let Some(from) = &a.from {
        return retarget_predictor(&a, from);
    }
    leanstream::sparsity::check_sparsity(a.sparsity)?;
    let (file, id, trace) = open_traced(&a.model, &a.trace)?;
    let thresholds = oracle_thresholds(&a.model, &file, a.thresholds.clone(), a.sparsity)?;
    let o = TrainOptions {
        sparsity: a.sparsity,
        depth: a.depth,
        heads: a.heads,
        tau: a.tau,
        out_heads: a.out_heads,
        out_tau: a.out_tau,
        pca: a.pca,
        epochs: a.epochs,
        batch: a.batch,
        lr: a.lr,
        temperature: a.temperature,
        seed: a.seed,
        target_recall: a.target_recall,
        input: parse_input(&a.input)?,
        spread: match a.votes.as_str() {
            "spread" => true,
            "half" => false,
            v => return Err(format!("--votes {v}: expected spread or half")),
        },
        probe: match &a.probe {
            None => Vec::new(),
            Some(p) => p
                .split(',')
                .map(|l| {
                    l.trim()
                        .parse()
                        .map_err(|_| format!("--probe: bad layer '{l}'"))
                })
                .collect::<Result<_, _>>()?,
        },
    };
    let started = Instant::now();
    let table = train::train(
        &trace,
        &model_name(&a.model),
        &thresholds,
        &o,
        &mut |l, log| {
            eprintln!(
                "train-predictor: layer {l}: loss {:.4} -> {:.4}, reads {} for recall {:.3} ({:.0} s)",
                log.first_loss,
                log.last_loss,
                log.read,
                log.recall,
                started.elapsed().as_secs_f64()
            )
        },
    )?;
    if a.probe.is_some() {
        println!("probed {} layers; no table written", table.layers.len());
        return Ok(());
    }
    write_table(&a, &table, id)
}

/// `train-predictor --from`: the table's read counts for another target recall.
fn retarget_predictor(a: &TrainPredictorArgs, from: &Path) -> Result<(), String> {
    let (file, id, trace) = open_traced(&a.model, &a.trace)?;
    let h = file.hyper().map_err(|e| e.to_string())?;
    let mut table = read_table(from, id, h.n_layers, h.dim, h.hidden_dim)?;
    let thresholds = oracle_thresholds(&a.model, &file, a.thresholds.clone(), table.sparsity)?;
    let before: Vec<u32> = table.layers.iter().map(|n| n.read).collect();
    train::retarget(
        &trace,
        &thresholds,
        &mut table,
        a.target_recall,
        &mut |l, read, recall| {
            eprintln!(
                "train-predictor: layer {l}: reads {} -> {read} for recall {recall:.3}",
                before[l]
            )
        },
    )?;
    write_table(a, &table, id)
}

fn write_table(a: &TrainPredictorArgs, table: &HashPredictorTable, id: u64) -> Result<(), String> {
    let bytes = table.encode(id);
    std::fs::write(&a.out, &bytes).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let model_bytes = std::fs::metadata(&a.model).map(|m| m.len()).unwrap_or(0);
    let reads: f64 =
        table.layers.iter().map(|n| n.read as f64).sum::<f64>() / table.layers.len().max(1) as f64;
    println!(
        "wrote {}: {} layers, {} bytes in memory ({:.3}% of the model file), {} on disk, mean read {:.0} of {} neurons",
        a.out.display(),
        table.layers.len(),
        table.bytes(),
        100.0 * table.bytes() as f64 / model_bytes.max(1) as f64,
        bytes.len(),
        reads,
        table.neurons
    );
    Ok(())
}

#[derive(Args)]
pub struct PredictorReportArgs {
    /// The model the trace was recorded from.
    #[arg(long)]
    model: PathBuf,
    /// A held-out trace (text the predictor was not trained on).
    #[arg(long)]
    trace: PathBuf,
    /// The hashing predictor's table (`leanstream train-predictor`).
    #[arg(long)]
    predictor: PathBuf,
    /// Thresholds table (default as for train-predictor).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// The oracle's sparsity (default: the one the predictor was trained at).
    #[arg(long)]
    sparsity: Option<f32>,
    /// Baselines' tables (`leanstream train-baseline`: dejavu, dejavu-stale, bnn) measured
    /// beside it, comma-separated.
    #[arg(long, value_delimiter = ',')]
    baseline: Vec<PathBuf>,
    /// Where to write the report (JSON).
    #[arg(long)]
    out: PathBuf,
    /// Also measure speculate-and-refine (layer n+1 guessed after each stage of layer n; the
    /// predictor must read prev-ffn-output and the trace have 2 or more stages): JSON here.
    #[arg(long)]
    refine: Option<PathBuf>,
}

/// The predictor table for the model of identity `id`; a table of another model is refused
/// with that model's name when the file is otherwise sound.
fn read_table(
    path: &Path,
    id: u64,
    layers: usize,
    dim: usize,
    neurons: usize,
) -> Result<HashPredictorTable, String> {
    use leanstream::tables::TableError;
    match HashPredictorTable::read(path, id, layers, dim, neurons) {
        Ok(t) => Ok(t),
        Err(TableError::OtherModel { found, .. }) => {
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let other: Result<HashPredictorTable, _> = leanstream::tables::decode(
                &bytes,
                leanstream::predict::hash::KIND,
                leanstream::predict::hash::VERSION,
                found,
            );
            let name = other.map(|t| t.model).unwrap_or_else(|_| "?".into());
            Err(format!(
                "{}: the predictor was made for another model, {name} (identity {found:016x}; this model is {id:016x})",
                path.display()
            ))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

pub fn cmd_predictor_report(a: PredictorReportArgs) -> Result<(), String> {
    use leanstream_tools::offline::predictor_report::{
        report, HashPredictor, Predictor, StalePredictor,
    };
    let (file, id, trace) = open_traced(&a.model, &a.trace)?;
    let h = file.hyper().map_err(|e| e.to_string())?;
    let table = read_table(&a.predictor, id, h.n_layers, h.dim, h.hidden_dim)?;
    let sparsity = a.sparsity.unwrap_or(table.sparsity);
    leanstream::sparsity::check_sparsity(sparsity)?;
    let thresholds = oracle_thresholds(&a.model, &file, a.thresholds.clone(), sparsity)?;
    let model_bytes = std::fs::metadata(&a.model)
        .map_err(|e| format!("{}: {e}", a.model.display()))?
        .len();
    let mut hash = HashPredictor::new(table);
    if let Some(path) = &a.refine {
        refine_report(&trace, &thresholds, sparsity, &mut hash, path)?;
    }
    let mut stale = StalePredictor::new(h.n_layers, h.hidden_dim);
    let mut baselines = a
        .baseline
        .iter()
        .map(|p| {
            leanstream::predict::mlp::MlpPredictorTable::read(
                p,
                id,
                h.n_layers,
                h.dim,
                h.hidden_dim,
            )
            .map(leanstream_tools::offline::train_mlp::MlpReport::new)
            .map_err(|e| format!("--baseline {}: {e}", p.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut list: Vec<&mut dyn Predictor> = vec![&mut hash, &mut stale];
    for b in baselines.iter_mut() {
        list.push(b);
    }
    let mut json = report(&trace, &thresholds, sparsity, model_bytes, &mut list)?;
    json["trace"] = a.trace.display().to_string().into();
    json["predictor"] = a.predictor.display().to_string().into();
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&a.out, text + "\n").map_err(|e| format!("{}: {e}", a.out.display()))?;
    for p in json["predictors"].as_array().into_iter().flatten() {
        let o = &p["overall"];
        println!(
            "{}: {} bytes ({:.3}% of the model), {:.1} us/layer, recall {:.3}, top-10% recall {:.3}, redundancy {:.3}, reads {:.0}",
            p["name"].as_str().unwrap_or(""),
            o["bytes"],
            o["model_pct"].as_f64().unwrap_or(0.0),
            o["us_per_layer"].as_f64().unwrap_or(0.0),
            o["recall"].as_f64().unwrap_or(0.0),
            o["top10_recall"].as_f64().unwrap_or(0.0),
            o["redundancy"].as_f64().unwrap_or(0.0),
            o["read_mean"].as_f64().unwrap_or(0.0),
        );
    }
    println!("wrote {}", a.out.display());
    Ok(())
}

/// `predictor-report --refine`: the stages' figures into `path`, and a line per order.
fn refine_report(
    trace: &TraceReader,
    thresholds: &[f32],
    sparsity: f32,
    hash: &mut leanstream_tools::offline::predictor_report::HashPredictor,
    path: &Path,
) -> Result<(), String> {
    let json = leanstream_tools::offline::refine_report::refine(trace, thresholds, sparsity, hash)?;
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    for (order, m) in json["orders"].as_object().into_iter().flatten() {
        for metric in ["top10_recall", "importance"] {
            let v: Vec<String> = m[metric]["mean"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| format!("{:.3}", x.as_f64().unwrap_or(0.0)))
                .collect();
            println!("refine {order} {metric} by stage: {}", v.join(" "));
        }
    }
    println!("wrote {}", path.display());
    Ok(())
}

#[derive(Args)]
pub struct PredictorLatencyArgs {
    /// Predictor tables (hashpred from train-predictor, mlppred from train-baseline),
    /// comma-separated; each is read for the model it names, which need not be here.
    #[arg(long, value_delimiter = ',', required = true)]
    predictor: Vec<PathBuf>,
    /// Inputs per layer.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// The inputs' seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A table file's model identity, from its header (offset 16), for reading it where the
/// model is not.
fn table_identity(path: &Path) -> Result<(Vec<u8>, u64), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let id = bytes
        .get(16..24)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .ok_or_else(|| format!("{}: not a predictor table (too short)", path.display()))?;
    Ok((bytes, id))
}

/// `leanstream predictor-latency`: each table's latency per layer on the core it runs on,
/// without the model or a trace.
pub fn cmd_predictor_latency(a: PredictorLatencyArgs) -> Result<(), String> {
    use leanstream::predict::{hash, mlp};
    use leanstream_tools::offline::predictor_report::{latency, HashPredictor, Predictor};
    use leanstream_tools::offline::train_mlp::MlpReport;
    if a.tokens == 0 {
        return Err("--tokens: at least 1".into());
    }
    println!("| table | model | predictor | layers | bytes | us/layer (mean of medians) | slowest layer |");
    println!("|---|---|---|---|---|---|---|");
    for path in &a.predictor {
        let (bytes, id) = table_identity(path)?;
        let shown = |e: leanstream::tables::TableError| format!("{}: {e}", path.display());
        let hashed: Result<HashPredictorTable, _> =
            leanstream::tables::decode(&bytes, hash::KIND, hash::VERSION, id);
        let (mut p, model, layers, dim): (Box<dyn Predictor>, String, usize, usize) = match hashed {
            Ok(t) => {
                t.validate()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let (m, l, d) = (t.model.clone(), t.layers.len(), t.dim as usize);
                (Box::new(HashPredictor::new(t)), m, l, d)
            }
            Err(leanstream::tables::TableError::WrongKind { .. }) => {
                let t: mlp::MlpPredictorTable =
                    leanstream::tables::decode(&bytes, mlp::KIND, mlp::VERSION, id)
                        .map_err(shown)?;
                t.validate()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let (m, l, d) = (t.model.clone(), t.layers.len(), t.dim as usize);
                (Box::new(MlpReport::new(t)), m, l, d)
            }
            Err(e) => return Err(shown(e)),
        };
        let us = latency(p.as_mut(), layers, dim, a.tokens, a.seed);
        let size: usize = (0..layers).map(|l| p.layer_bytes(l)).sum();
        let mean = us.iter().sum::<f64>() / us.len().max(1) as f64;
        let slowest = us.iter().cloned().fold(0.0, f64::max);
        println!(
            "| {} | {model} | {} | {layers} | {size} | {mean:.1} | {slowest:.1} |",
            path.display(),
            p.name()
        );
    }
    Ok(())
}
