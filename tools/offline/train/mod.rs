//! `leanstream train-predictor`: the stacked learnable hashing predictor (paper 3.3) trained on
//! an activation trace, one net per layer, written as a `hashpred` table
//! (`leanstream::predict::hash`).
//!
//! - [`data`]: the inputs a predictor reads and the oracle's labels, from a trace.
//! - [`pca`]: the fixed 30% projection the first layer starts from.
//! - [`net`]: the graph (straight-through signs, gumbel-softmax buckets, BCE on the output
//!   bits) in candle, and [`export`]: the trained graph as the table's integer net.
//! - [`rng`]: the seeded randomness (same seed, same bytes).
//!
//! After training, each layer's `read` is the fewest top-scored neurons whose mean recall of
//! the oracle set on the training tokens reaches the target (computed with the table's own
//! integer inference, so it is what the runtime will see).

pub mod data;
pub mod export;
pub mod net;
pub mod pca;
pub mod rng;

use crate::offline::oracle;
use crate::offline::trace::TraceReader;
use candle_core::{Device, Tensor};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use data::Inputs;
use leanstream::predict::hash::{HashPredictorTable, PredictorInput};
use net::{Net, Shape, Soft};
use rng::Rng;

/// Everything that shapes a training run (the CLI's options).
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The oracle's sparsity the labels are made at.
    pub sparsity: f32,
    pub depth: usize,
    pub heads: usize,
    pub tau: usize,
    pub out_heads: usize,
    pub out_tau: usize,
    /// The share of the input's dimensions the PCA keeps.
    pub pca: f32,
    pub epochs: usize,
    pub batch: usize,
    pub lr: f64,
    pub temperature: f64,
    pub seed: u64,
    pub target_recall: f32,
    pub input: PredictorInput,
    /// Train only these layers (a quick look at settings; the table is then incomplete and
    /// not for use). Empty: every layer.
    pub probe: Vec<usize>,
    /// The output heads vote at spread probabilities (`net::vote_levels`).
    pub spread: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            sparsity: 0.5,
            depth: 5,
            heads: 4,
            tau: 8,
            out_heads: 4,
            out_tau: 8,
            pca: 0.3,
            epochs: 20,
            batch: 256,
            lr: 0.01,
            temperature: 1.0,
            seed: 0,
            target_recall: 0.9,
            input: PredictorInput::FfnInput,
            probe: Vec::new(),
            spread: true,
        }
    }
}

/// How one layer's training went (for the log and the report).
#[derive(Clone, Debug)]
pub struct LayerLog {
    pub first_loss: f32,
    pub last_loss: f32,
    pub read: u32,
    pub recall: f64,
}

fn err(e: candle_core::Error) -> String {
    format!("training: {e}")
}

/// The mean recall of the oracle sets by the top `r` scores, for every r in 0..=neurons:
/// `sets[t]` is token t's oracle set, `scores(t, out)` its scores. Tokens of an empty set
/// count as recalled. Ranks follow `hash::top_scores` (score descending, ties to the lower
/// index), so the top r are the read set of `read = r`.
pub fn recall_curve(
    neurons: usize,
    sets: &[Vec<u32>],
    mut scores: impl FnMut(usize, &mut [u8]),
) -> Vec<f64> {
    let mut s = vec![0u8; neurons];
    recall_curve_ranked(neurons, sets, |t, order| {
        scores(t, &mut s);
        order.clear();
        order.extend(0..neurons as u32);
        order.sort_by(|&a, &b| s[b as usize].cmp(&s[a as usize]).then(a.cmp(&b)));
    })
}

/// [`recall_curve`] for any predictor: `rank(t, order)` writes every neuron, best first.
pub fn recall_curve_ranked(
    neurons: usize,
    sets: &[Vec<u32>],
    mut rank: impl FnMut(usize, &mut Vec<u32>),
) -> Vec<f64> {
    let mut curve = vec![0f64; neurons + 1];
    let mut order: Vec<u32> = Vec::with_capacity(neurons);
    let mut member = vec![false; neurons];
    for (t, set) in sets.iter().enumerate() {
        if set.is_empty() {
            curve.iter_mut().for_each(|c| *c += 1.0);
            continue;
        }
        rank(t, &mut order);
        for &j in set {
            member[j as usize] = true;
        }
        let mut hit = 0usize;
        for (r, &j) in order.iter().enumerate() {
            hit += member[j as usize] as usize;
            curve[r + 1] += hit as f64 / set.len() as f64;
        }
        for &j in set {
            member[j as usize] = false;
        }
    }
    let n = sets.len().max(1) as f64;
    curve.iter_mut().for_each(|c| *c /= n);
    curve
}

/// Trains one net per layer of `trace` against the oracle sets at `thresholds` (one per
/// layer, at `o.sparsity`); `progress(layer, log)` after each.
pub fn train(
    trace: &TraceReader,
    model_name: &str,
    thresholds: &[f32],
    o: &TrainOptions,
    progress: &mut dyn FnMut(usize, &LayerLog),
) -> Result<HashPredictorTable, String> {
    let (nl, dim, n, tn) = (trace.layers, trace.dim, trace.hidden, trace.tokens);
    if thresholds.len() != nl {
        return Err(format!(
            "{} thresholds for a trace of {nl} layers",
            thresholds.len()
        ));
    }
    if !(o.pca > 0.0 && o.pca <= 1.0) {
        return Err(format!("--pca {}: a share in (0, 1]", o.pca));
    }
    if o.epochs == 0 || o.batch == 0 || tn == 0 {
        return Err("no training: epochs, batch and tokens must be at least 1".into());
    }
    if !(o.target_recall > 0.0 && o.target_recall <= 1.0) {
        return Err(format!(
            "--target-recall {}: a share in (0, 1]",
            o.target_recall
        ));
    }
    let pca_dims = ((o.pca * dim as f32).round() as usize).clamp(1, dim);
    let shape = Shape {
        dim,
        pca: pca_dims,
        heads: o.heads,
        tau: o.tau,
        depth: o.depth,
        out_heads: o.out_heads,
        out_tau: o.out_tau,
        neurons: n,
    };
    let mut table = HashPredictorTable {
        model: model_name.to_string(),
        dim: dim as u32,
        neurons: n as u32,
        input: o.input,
        depth: o.depth as u8,
        heads: o.heads as u8,
        tau: o.tau as u8,
        out_heads: o.out_heads as u8,
        out_tau: o.out_tau as u8,
        sparsity: o.sparsity,
        target_recall: o.target_recall,
        seed: o.seed,
        pca_dims: pca_dims as u32,
        layers: Vec::new(),
    };
    // The shape's limits are the table's: check them before hours of training.
    let probe = HashPredictorTable {
        layers: Vec::new(),
        ..table.clone()
    };
    probe.validate()?;
    if o.depth > u8::MAX as usize {
        return Err(format!("--depth {}: at most 255", o.depth));
    }
    let inputs = Inputs::new(trace)?;
    for (l, &thr) in thresholds.iter().enumerate() {
        if !o.probe.is_empty() && !o.probe.contains(&l) {
            continue;
        }
        let (x, y) = data::layer_set(trace, &inputs, o.input, l, thr)?;
        let mut rng = Rng::new(o.seed ^ (l as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
        let (net, first_loss, last_loss) = fit(shape, &x, &y, o, &mut rng).map_err(err)?;
        table
            .layers
            .push(export::export(&net, n as u32).map_err(err)?);
        let at = table.layers.len() - 1;
        let (read, recall) = set_read(&mut table, at, l, trace, &inputs, thr)?;
        progress(
            l,
            &LayerLog {
                first_loss,
                last_loss,
                read,
                recall,
            },
        );
    }
    table.validate()?;
    Ok(table)
}

/// Sets the `read` of `table`'s net `at` (the model's layer `l`) to the fewest top-scored
/// neurons whose mean recall of the oracle sets at `thr` on `trace` reaches the table's
/// target, by the table's own inference (what the runtime will see); returns it and its recall.
fn set_read(
    table: &mut HashPredictorTable,
    at: usize,
    l: usize,
    trace: &TraceReader,
    inputs: &Inputs,
    thr: f32,
) -> Result<(u32, f64), String> {
    let (nl, n) = (trace.layers, trace.hidden);
    let acts = trace.tensor("neuron_act")?;
    let sets = oracle_sets(acts, nl, n, l, thr);
    let input = table.input;
    let curve = recall_curve(n, &sets, |t, out| {
        table.scores(at, inputs.row(input, t, l), out)
    });
    let read = (1..=n)
        .find(|&r| curve[r] >= table.target_recall as f64 - 1e-12)
        .unwrap_or(n);
    table.layers[at].read = read as u32;
    Ok((read as u32, curve[read]))
}

/// `train-predictor --from`: a trained table's read counts set again for `target_recall` on
/// `trace`, its nets untouched (a point further along the same table's recall/bytes curve,
/// without training again). `thresholds` are the table's sparsity's; `progress(layer, read,
/// recall)` after each layer.
pub fn retarget(
    trace: &TraceReader,
    thresholds: &[f32],
    table: &mut HashPredictorTable,
    target_recall: f32,
    progress: &mut dyn FnMut(usize, u32, f64),
) -> Result<(), String> {
    if !(target_recall > 0.0 && target_recall <= 1.0) {
        return Err(format!(
            "--target-recall {target_recall}: a share in (0, 1]"
        ));
    }
    if thresholds.len() != trace.layers || table.layers.len() != trace.layers {
        return Err(format!(
            "a table of {} layers and {} thresholds for a trace of {} layers",
            table.layers.len(),
            thresholds.len(),
            trace.layers
        ));
    }
    let inputs = Inputs::new(trace)?;
    table.target_recall = target_recall;
    for (l, &thr) in thresholds.iter().enumerate() {
        let (read, recall) = set_read(table, l, l, trace, &inputs, thr)?;
        progress(l, read, recall);
    }
    table.validate()?;
    Ok(())
}

/// Trains one layer's net on inputs `x` [N * dim] and labels `y` [N * neurons]; returns it
/// with the first and last epochs' mean loss.
pub fn fit(
    shape: Shape,
    x: &[f32],
    y: &[f32],
    o: &TrainOptions,
    rng: &mut Rng,
) -> candle_core::Result<(Net, f32, f32)> {
    let dev = Device::Cpu;
    let tn = x.len() / shape.dim;
    let xt = Tensor::from_slice(x, (tn, shape.dim), &dev)?;
    let yt = Tensor::from_slice(y, (tn, shape.neurons), &dev)?;
    let start = rng.normals(shape.dim * shape.pca, 1.0);
    let p = pca::fit(&xt, shape.pca, start)?;
    // Each neuron's base rate as the last layer's starting logit: a bucket no training token
    // reaches then says what is usual for the neuron, not noise.
    let base = base_logits(y, shape.neurons);
    let levels = net::vote_levels(shape.out_heads, o.spread);
    let cols = shape.cols();
    let k2 = cols.min(shape.pca);
    let w1 = pca::predictive_planes(
        &xt,
        &yt,
        &p,
        cols,
        rng.normals(shape.pca * k2, 1.0),
        rng.normals(k2 * cols, 1.0),
    )?;
    let net = Net::new(shape, p, w1, &base, &levels, rng)?;
    let (first, last) = descend(
        net.vars(),
        (&xt, &yt),
        (o.epochs, o.batch, o.lr),
        rng,
        |xb, yb, rng| {
            let mut soft = Soft {
                rng,
                temperature: o.temperature,
            };
            net::bce(&net.forward(xb, Some(&mut soft))?.logits, yb)
        },
        || net.clamp_offsets(),
    )?;
    refit_rows(&net, &xt, &yt, &base)?;
    Ok((net, first, last))
}

/// Each of the `n` label columns' base rate in `y` (rows of `n`) as a logit, the rate clamped
/// to [1e-3, 1 - 1e-3]: where a net's output starts.
pub fn base_logits(y: &[f32], n: usize) -> Vec<f32> {
    let rows = (y.len() / n).max(1) as f32;
    let mut base = vec![0f32; n];
    for row in y.chunks_exact(n) {
        for (b, v) in base.iter_mut().zip(row) {
            *b += v;
        }
    }
    for b in base.iter_mut() {
        let p = (*b / rows).clamp(1e-3, 1.0 - 1e-3);
        *b = (p / (1.0 - p)).ln();
    }
    base
}

/// Layer `l`'s oracle set for every token of a trace's activations `acts` ([T, layers, n]).
pub fn oracle_sets(acts: &[f32], layers: usize, n: usize, l: usize, thr: f32) -> Vec<Vec<u32>> {
    (0..acts.len() / (layers * n))
        .map(|t| {
            let mut s = Vec::new();
            oracle::oracle_set(&acts[(t * layers + l) * n..][..n], thr, &mut s);
            s
        })
        .collect()
}

/// Minibatch AdamW over `vars`: `epochs` passes over the rows of `(x, y)` in a seeded order,
/// `batch` rows a step, `loss(xb, yb, rng)` a batch's loss, `after` once after each step.
/// Returns the first and last epochs' mean loss.
pub fn descend(
    vars: Vec<candle_core::Var>,
    (x, y): (&Tensor, &Tensor),
    (epochs, batch, lr): (usize, usize, f64),
    rng: &mut Rng,
    mut loss: impl FnMut(&Tensor, &Tensor, &mut Rng) -> candle_core::Result<Tensor>,
    mut after: impl FnMut() -> candle_core::Result<()>,
) -> candle_core::Result<(f32, f32)> {
    let mut opt = AdamW::new(
        vars,
        ParamsAdamW {
            lr,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    let mut order: Vec<u32> = (0..x.dim(0)? as u32).collect();
    let (mut first, mut last) = (0f32, 0f32);
    for epoch in 0..epochs {
        rng.shuffle(&mut order);
        let (mut sum, mut batches) = (0f32, 0usize);
        for chunk in order.chunks(batch) {
            let idx = Tensor::from_slice(chunk, chunk.len(), x.device())?;
            let (xb, yb) = (x.index_select(&idx, 0)?, y.index_select(&idx, 0)?);
            let l = loss(&xb, &yb, rng)?;
            opt.backward_step(&l)?;
            after()?;
            sum += l.to_vec0::<f32>()?;
            batches += 1;
        }
        let mean = sum / batches.max(1) as f32;
        if epoch == 0 {
            first = mean;
        }
        last = mean;
    }
    Ok((first, last))
}

/// Sets the last layer's rows to their best value for the trained hashes: for fixed buckets,
/// BCE is least at each bucket's rate of the neuron being active among the training tokens
/// that reach it, here smoothed toward the neuron's base rate by [`PRIOR_TOKENS`] pseudo-tokens
/// (a bucket few tokens reach keeps close to the base rate). Gradient steps only approach
/// this, slowly, for rows few tokens reach.
fn refit_rows(net: &Net, x: &Tensor, y: &Tensor, base: &[f32]) -> candle_core::Result<()> {
    let hard = net.forward(x, None)?.hard; // [oh, N, R]
    let count = hard.sum_keepdim(1)?.transpose(1, 2)?; // [oh, R, 1]
    let pos = hard.transpose(1, 2)?.contiguous()?.broadcast_matmul(y)?; // [oh, R, n]
    let prior: Vec<f32> = base.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
    let prior = Tensor::from_vec(prior, (1, 1, base.len()), x.device())?;
    let rate = pos
        .broadcast_add(&prior.affine(PRIOR_TOKENS, 0.0)?)?
        .broadcast_div(&(count + PRIOR_TOKENS)?)?
        .clamp(1e-3f32, 1.0 - 1e-3)?;
    let logit = (rate.log()? - rate.affine(-1.0, 1.0)?.log()?)?;
    net.to.set(&logit)
}

/// Pseudo-tokens at the base rate in every bucket of the last layer.
const PRIOR_TOKENS: f64 = 2.0;

#[cfg(test)]
mod tests;
