//! `leanstream predictor-report`: neuron predictors measured on a held-out trace against the
//! oracle (paper Table 6): per layer and overall, the size (bytes and share of the model file),
//! the latency of one prediction on one core (median over the tokens), the recall of the
//! oracle set by the read set, the recall of the oracle's top 10% (the neurons of largest
//! |activation|), and the relative loading redundancy (read neurons outside the oracle set
//! over the oracle set's size).
//!
//! A predictor plugs in through [`Predictor`]: the stacked learnable hashing table
//! ([`HashPredictorTable`]) and the `stale` baseline (the previous token's oracle set) are
//! here; the DejaVu and BNN baselines implement the same trait.

use super::oracle;
use super::trace::TraceReader;
use super::train::data::Inputs;
use leanstream::predict::hash::{self, HashPredictorTable, PredictorInput};
use serde_json::{json, Value};
use std::time::Instant;

/// What the report asks of a predictor.
pub trait Predictor {
    fn name(&self) -> String;
    /// Which input it reads.
    fn input(&self) -> PredictorInput;
    /// Its bytes for layer `l` as the runtime holds them.
    fn layer_bytes(&self, l: usize) -> usize;
    /// The neurons to read for layer `l` given its input `x` (scores and the read set: what
    /// the runtime would do; this call is what the latency times).
    fn predict(&mut self, l: usize, x: &[f32], read: &mut Vec<u32>);
    /// Layer `l`'s oracle set once the layer has run; `new_window` at a window's first token
    /// (before `predict`, with an empty set: nothing is known yet).
    fn observe(&mut self, _l: usize, _oracle: &[u32], _new_window: bool) {}
    /// Its settings, for the report.
    fn describe(&self) -> Value {
        Value::Null
    }
}

/// The hashing table with its scratch, sized once.
pub struct HashPredictor {
    pub table: HashPredictorTable,
    layer_bytes: Vec<usize>,
    scores: Vec<u8>,
    count: Vec<u32>,
    out: Vec<u32>,
}

impl HashPredictor {
    pub fn new(table: HashPredictorTable) -> HashPredictor {
        let n = table.neurons as usize;
        let mut one = table.clone();
        let layer_bytes = table
            .layers
            .iter()
            .map(|net| {
                one.layers = vec![net.clone()];
                one.bytes()
            })
            .collect();
        HashPredictor {
            layer_bytes,
            scores: vec![0; n],
            count: vec![0; table.out_heads as usize + 1],
            out: vec![0; n],
            table,
        }
    }
}

impl Predictor for HashPredictor {
    fn name(&self) -> String {
        "hash".into()
    }
    fn input(&self) -> PredictorInput {
        self.table.input
    }
    fn layer_bytes(&self, l: usize) -> usize {
        self.layer_bytes[l]
    }
    fn predict(&mut self, l: usize, x: &[f32], read: &mut Vec<u32>) {
        self.table.scores(l, x, &mut self.scores);
        let k = hash::top_scores(
            &self.scores,
            self.table.layers[l].read as usize,
            &mut self.count,
            &mut self.out,
        );
        read.clear();
        read.extend_from_slice(&self.out[..k]);
    }
    fn describe(&self) -> Value {
        let t = &self.table;
        json!({
            "depth": t.depth, "heads": t.heads, "tau": t.tau, "d": 64 * t.heads as u32,
            "out_heads": t.out_heads, "out_tau": t.out_tau, "pca_dims": t.pca_dims,
            "input": format!("{:?}", t.input), "trained_sparsity": t.sparsity,
            "target_recall": t.target_recall, "seed": t.seed,
            "read": t.layers.iter().map(|n| n.read).collect::<Vec<_>>(),
        })
    }
}

/// The previous token's oracle set (nothing at a window's first token).
pub struct StalePredictor {
    last: Vec<Vec<u32>>,
    neurons: usize,
}

impl StalePredictor {
    pub fn new(layers: usize, neurons: usize) -> StalePredictor {
        StalePredictor {
            last: vec![Vec::new(); layers],
            neurons,
        }
    }
}

impl Predictor for StalePredictor {
    fn name(&self) -> String {
        "stale".into()
    }
    fn input(&self) -> PredictorInput {
        PredictorInput::FfnInput
    }
    fn layer_bytes(&self, _l: usize) -> usize {
        // One bit per neuron: the runtime's used-last-token bitmap.
        self.neurons.div_ceil(8)
    }
    fn predict(&mut self, l: usize, _x: &[f32], read: &mut Vec<u32>) {
        read.clear();
        read.extend_from_slice(&self.last[l]);
    }
    fn observe(&mut self, l: usize, oracle: &[u32], new_window: bool) {
        self.last[l].clear();
        if !new_window {
            self.last[l].extend_from_slice(oracle);
        }
    }
}

/// Which neurons a read set holds, as a bitmap sized once: `count` marks `read`, counts the
/// neurons of `of` it holds, and clears the marks again.
pub struct ReadMarks(Vec<bool>);

impl ReadMarks {
    pub fn new(neurons: usize) -> ReadMarks {
        ReadMarks(vec![false; neurons])
    }

    /// Runs `f` with a test "is neuron j read" while `read` is marked.
    pub fn with<R>(&mut self, read: &[u32], f: impl FnOnce(&dyn Fn(u32) -> bool) -> R) -> R {
        for &j in read {
            self.0[j as usize] = true;
        }
        let marks = &self.0;
        let r = f(&|j| marks[j as usize]);
        for &j in read {
            self.0[j as usize] = false;
        }
        r
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Sums of one layer's per-token measures.
#[derive(Default, Clone)]
struct Acc {
    recall: f64,
    top10: f64,
    redundancy: f64,
    read: f64,
    tokens: usize,
    micros: Vec<f64>,
}

/// Measures every predictor on `trace` against the oracle sets at `thresholds` (one per
/// layer, at `sparsity`); `model_bytes` is the model file's size. Returns the report's JSON.
pub fn report(
    trace: &TraceReader,
    thresholds: &[f32],
    sparsity: f32,
    model_bytes: u64,
    predictors: &mut [&mut dyn Predictor],
) -> Result<Value, String> {
    let (nl, n, tn) = (trace.layers, trace.hidden, trace.tokens);
    if thresholds.len() != nl {
        return Err(format!(
            "{} thresholds for a trace of {nl} layers",
            thresholds.len()
        ));
    }
    let inputs = Inputs::new(trace)?;
    let acts = trace.tensor("neuron_act")?;
    let m10 = ((0.1 * n as f64).round() as usize).max(1);
    let mut acc = vec![vec![Acc::default(); nl]; predictors.len()];
    let (mut set, mut top, mut order, mut read) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut marks = ReadMarks::new(n);
    for t in 0..tn {
        let new_window = trace.position(t)? == 0;
        for l in 0..nl {
            let a = &acts[(t * nl + l) * n..][..n];
            oracle::oracle_set(a, thresholds[l], &mut set);
            oracle::top_magnitude(a, m10, &mut order, &mut top);
            for (pi, p) in predictors.iter_mut().enumerate() {
                if new_window {
                    p.observe(l, &[], true);
                }
                let x = inputs.row(p.input(), t, l);
                let start = Instant::now();
                p.predict(l, x, &mut read);
                let us = start.elapsed().as_secs_f64() * 1e6;
                p.observe(l, &set, false);
                let c = &mut acc[pi][l];
                c.micros.push(us);
                let (top_hit, hit) = marks.with(&read, |held| {
                    let count = |v: &[u32]| v.iter().filter(|&&j| held(j)).count();
                    (count(&top), count(&set))
                });
                c.top10 += top_hit as f64 / m10 as f64;
                c.read += read.len() as f64;
                if !set.is_empty() {
                    c.recall += hit as f64 / set.len() as f64;
                    c.redundancy += (read.len() - hit) as f64 / set.len() as f64;
                    c.tokens += 1;
                }
            }
        }
    }
    let mut out = Vec::new();
    for (pi, p) in predictors.iter().enumerate() {
        let mut layers = Vec::new();
        let (mut bytes, mut us_token) = (0usize, 0f64);
        let (mut recall, mut top10, mut red, mut rd) = (0f64, 0f64, 0f64, 0f64);
        for (l, c) in acc[pi].iter_mut().enumerate() {
            let b = p.layer_bytes(l);
            let us = median(&mut c.micros);
            let k = c.tokens.max(1) as f64;
            let (r, t10, re, rm) = (
                c.recall / k,
                c.top10 / tn.max(1) as f64,
                c.redundancy / k,
                c.read / tn.max(1) as f64,
            );
            layers.push(json!({
                "layer": l, "bytes": b, "us_median": us, "recall": r, "top10_recall": t10,
                "redundancy": re, "read_mean": rm,
            }));
            bytes += b;
            us_token += us;
            recall += r / nl as f64;
            top10 += t10 / nl as f64;
            red += re / nl as f64;
            rd += rm / nl as f64;
        }
        out.push(json!({
            "name": p.name(),
            "settings": p.describe(),
            "overall": {
                "bytes": bytes,
                "model_pct": 100.0 * bytes as f64 / model_bytes.max(1) as f64,
                "us_per_layer": us_token / nl as f64,
                "us_per_token": us_token,
                "recall": recall, "top10_recall": top10, "redundancy": red, "read_mean": rd,
            },
            "layers": layers,
        }));
    }
    Ok(json!({
        "model": trace.meta("model").unwrap_or(""),
        "model_bytes": model_bytes,
        "text": trace.meta("text").unwrap_or(""),
        "skip_tokens": trace.meta("skip_tokens").unwrap_or(""),
        "tokens": tn,
        "layers": nl,
        "neurons": n,
        "sparsity": sparsity,
        "predictors": out,
    }))
}

/// Each layer's median latency (us) of `p` predicting `tokens` inputs of `dim` values (each
/// input through every layer, as the report and the runtime go), with no trace: inputs drawn from a seeded normal. The integer work of the hashing and the MLPs does
/// not depend on the values, so a machine without the model and its trace (the GPU machine's
/// quiet Xeon) measures what the report's `us_per_layer` measures.
pub fn latency(
    p: &mut dyn Predictor,
    layers: usize,
    dim: usize,
    tokens: usize,
    seed: u64,
) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    // Sum of 4 uniforms, centred: near enough a normal for signs and magnitudes.
    let x: Vec<f32> = (0..tokens.max(1) * dim)
        .map(|_| (0..4).map(|_| uniform()).sum::<f32>() - 2.0)
        .collect();
    let mut read = Vec::new();
    // Token by token through every layer, as the runtime asks (a layer's table is not still
    // in the cache from the token before).
    let mut micros = vec![Vec::with_capacity(tokens); layers];
    for row in x.chunks(dim) {
        for (l, m) in micros.iter_mut().enumerate() {
            let start = Instant::now();
            p.predict(l, row, &mut read);
            m.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    micros.iter_mut().map(|m| median(m)).collect()
}
