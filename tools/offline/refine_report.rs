//! `leanstream predictor-report --refine`: speculate-and-refine measured on a held-out trace
//! (LeanStream paper 2.1, eq. 1-2, and figure 12). Layer n's FFN runs in K stages; after stage
//! k the partial residual x_n + sum of stages 1..=k (eq. 2) goes through layer n+1's predictor,
//! whose read set is the guess for layer n+1 before layer n has finished. Stage 0 is the one-shot
//! guess from the residual entering layer n's FFN; stage K is the predictor's own input (the
//! residual after layer n's whole FFN, `--input prev-ffn-output`).
//!
//! The trace records the stages in two orders (`tools/offline/trace.rs`): `priority`, the
//! neurons of layer n's oracle set in descending |activation| (the order a runtime that computes
//! the largest first approaches), and `index`, the same neurons in index order (an arbitrary
//! order). Per stage and order, averaged over tokens and over layers 1..L:
//! - `recall`: |read ∩ A| / |A|, A layer n+1's oracle set at the thresholds;
//! - `top10_recall`: the share of layer n+1's top 10% neurons (largest |activation|) read;
//! - `importance`: the |activation| mass of A the read set holds, sum over read ∩ A of |h| over
//!   the sum over A (1 when every oracle neuron is read).

use super::oracle;
use super::predictor_report::{Predictor, ReadMarks};
use super::trace::TraceReader;
use leanstream::predict::hash::PredictorInput;
use serde_json::{json, Value};

/// The two stage orders a trace records: (name, tensor).
const ORDERS: [(&str, &str); 2] = [
    ("priority", "stage_residual_priority"),
    ("index", "stage_residual_index"),
];

/// Per-layer sums over tokens, [order][stage].
#[derive(Clone)]
struct Sums {
    recall: Vec<Vec<f64>>,
    top10: Vec<Vec<f64>>,
    importance: Vec<Vec<f64>>,
    tokens: usize,
}

impl Sums {
    fn new(stages: usize) -> Sums {
        let z = vec![vec![0f64; stages + 1]; ORDERS.len()];
        Sums {
            recall: z.clone(),
            top10: z.clone(),
            importance: z,
            tokens: 0,
        }
    }
}

/// Measures `predictor` (which must read `PrevFfnOutput`) on every stage of `trace` against
/// the oracle sets at `thresholds`. Returns the report's JSON: per order and metric, the mean
/// over layers per stage (`mean`), and per layer (`layers`).
pub fn refine(
    trace: &TraceReader,
    thresholds: &[f32],
    sparsity: f32,
    predictor: &mut dyn Predictor,
) -> Result<Value, String> {
    let (nl, n, tn, k, dim) = (
        trace.layers,
        trace.hidden,
        trace.tokens,
        trace.stages,
        trace.dim,
    );
    if predictor.input() != PredictorInput::PrevFfnOutput {
        return Err(format!(
            "speculate-and-refine predicts layer n+1 from layer n's partial residual: the {} predictor reads {:?} (train it with --input prev-ffn-output)",
            predictor.name(),
            predictor.input()
        ));
    }
    if k < 2 {
        return Err(format!(
            "the trace has {k} stage(s): record it with --stages 2 or more (the paper uses 8)"
        ));
    }
    if thresholds.len() != nl || nl < 2 {
        return Err(format!(
            "{} thresholds for a trace of {nl} layers",
            thresholds.len()
        ));
    }
    let residual = trace.tensor("ffn_residual")?;
    let acts = trace.tensor("neuron_act")?;
    let staged = [trace.tensor(ORDERS[0].1)?, trace.tensor(ORDERS[1].1)?];
    let m10 = ((0.1 * n as f64).round() as usize).max(1);
    let mut sums = vec![Sums::new(k); nl];
    let (mut set, mut top, mut order, mut read) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut marks = ReadMarks::new(n);
    for t in 0..tn {
        for l in 1..nl {
            let a = &acts[(t * nl + l) * n..][..n];
            oracle::oracle_set(a, thresholds[l], &mut set);
            if set.is_empty() {
                continue;
            }
            oracle::top_magnitude(a, m10, &mut order, &mut top);
            let mass: f64 = set.iter().map(|&j| a[j as usize].abs() as f64).sum();
            let s = &mut sums[l];
            s.tokens += 1;
            for (oi, stages) in staged.iter().enumerate() {
                for stage in 0..=k {
                    let x = if stage == 0 {
                        &residual[(t * nl + l - 1) * dim..][..dim]
                    } else {
                        &stages[((t * nl + l - 1) * k + stage - 1) * dim..][..dim]
                    };
                    predictor.predict(l, x, &mut read);
                    let (hit, top_hit, held) = marks.with(&read, |held| {
                        let count = |v: &[u32]| v.iter().filter(|&&j| held(j)).count();
                        let mass: f64 = set
                            .iter()
                            .filter(|&&j| held(j))
                            .map(|&j| a[j as usize].abs() as f64)
                            .sum();
                        (count(&set), count(&top), mass)
                    });
                    s.recall[oi][stage] += hit as f64 / set.len() as f64;
                    s.top10[oi][stage] += top_hit as f64 / m10 as f64;
                    s.importance[oi][stage] += held / mass.max(f64::MIN_POSITIVE);
                }
            }
        }
    }
    let mut orders = serde_json::Map::new();
    for (oi, (name, _)) in ORDERS.iter().enumerate() {
        let mut metrics = serde_json::Map::new();
        for metric in ["recall", "top10_recall", "importance"] {
            let per_layer: Vec<Vec<f64>> = sums[1..]
                .iter()
                .map(|s| {
                    let v = match metric {
                        "recall" => &s.recall[oi],
                        "top10_recall" => &s.top10[oi],
                        _ => &s.importance[oi],
                    };
                    v.iter().map(|x| x / s.tokens.max(1) as f64).collect()
                })
                .collect();
            let mean: Vec<f64> = (0..=k)
                .map(|st| per_layer.iter().map(|r| r[st]).sum::<f64>() / per_layer.len() as f64)
                .collect();
            metrics.insert(metric.into(), json!({ "mean": mean, "layers": per_layer }));
        }
        orders.insert((*name).into(), Value::Object(metrics));
    }
    Ok(json!({
        "model": trace.meta("model").unwrap_or(""),
        "text": trace.meta("text").unwrap_or(""),
        "skip_tokens": trace.meta("skip_tokens").unwrap_or(""),
        "tokens": tn,
        "layers": nl,
        "neurons": n,
        "sparsity": sparsity,
        "trace_sparsity": trace.meta("sparsity").unwrap_or(""),
        "stages": k,
        "predictor": predictor.name(),
        "settings": predictor.describe(),
        "orders": Value::Object(orders),
    }))
}
