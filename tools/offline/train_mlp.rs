//! The baselines' predictors trained on the same traces and labels as ours
//! (`leanstream train-predictor --kind dejavu|dejavu-stale|bnn`), written as `mlppred` tables
//! (`leanstream::predict::mlp`):
//! - DejaVu's two-layer low-rank MLP: relu(x W1 + b1) W2^T + b2, BCE against the oracle set,
//!   on the layer's own FFN input (dejavu) or the previous layer's (dejavu-stale);
//! - a binarized MLP: the input's signs, binary weights in both layers (straight-through signs),
//!   binary hidden units; the score is the agreement count, so the logit is one shared affine
//!   map of it and the ranking the runtime sees is the one trained.
//!
//! Each layer's `read` is then set, as for the hashing tables, to the fewest top-scored neurons
//! whose mean recall of the oracle set on the training tokens reaches the target, scored by the
//! exported table's own inference.

use super::train::data::{self, Inputs};
use super::train::net::{bce, ste_sign};
use super::train::rng::Rng;
use super::train::{base_logits, descend, oracle_sets, recall_curve_ranked};
use crate::offline::trace::TraceReader;
use candle_core::{DType, Device, Result, Tensor, Var};
use leanstream::predict::hash::PredictorInput;
use leanstream::predict::mlp::{top_read, MlpNet, MlpPredictorTable, MlpWeights, MAX_RANK};

#[derive(Clone, Debug)]
pub struct MlpOptions {
    pub sparsity: f32,
    pub rank: usize,
    pub binary: bool,
    pub input: PredictorInput,
    pub epochs: usize,
    pub batch: usize,
    pub lr: f64,
    pub seed: u64,
    pub target_recall: f32,
}

fn var(v: Vec<f32>, shape: &[usize]) -> Result<Var> {
    Var::from_tensor(&Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// One layer's graph.
struct Mlp {
    binary: bool,
    /// Real: [dim, rank]; binary: the latent weights [rank, dim].
    w1: Var,
    /// Real: the bias; binary: the offsets in dot-product units.
    b1: Var,
    /// [neurons, rank] (latent, for the BNN).
    w2: Var,
    /// Real: [neurons]; binary: the shared scale and bias of the agreement count.
    b2: Var,
}

impl Mlp {
    fn new(
        dim: usize,
        rank: usize,
        n: usize,
        binary: bool,
        base: &[f32],
        rng: &mut Rng,
    ) -> Result<Mlp> {
        Ok(if binary {
            Mlp {
                binary,
                w1: var(rng.normals(rank * dim, 0.5), &[rank, dim])?,
                b1: var(vec![0.0; rank], &[rank])?,
                w2: var(rng.normals(n * rank, 0.5), &[n, rank])?,
                b2: var(vec![1.0, -1.0], &[2])?,
            }
        } else {
            Mlp {
                binary,
                w1: var(
                    rng.normals(dim * rank, 1.0 / (dim as f64).sqrt()),
                    &[dim, rank],
                )?,
                b1: var(vec![0.0; rank], &[rank])?,
                w2: var(
                    rng.normals(n * rank, 1.0 / (rank as f64).sqrt()),
                    &[n, rank],
                )?,
                b2: var(base.to_vec(), &[n])?,
            }
        })
    }

    fn vars(&self) -> Vec<Var> {
        vec![
            self.w1.clone(),
            self.b1.clone(),
            self.w2.clone(),
            self.b2.clone(),
        ]
    }

    /// The logits [N, neurons] for inputs x [N, dim].
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.binary {
            let h = x
                .matmul(self.w1.as_tensor())?
                .broadcast_add(self.b1.as_tensor())?
                .relu()?;
            return h
                .matmul(&self.w2.as_tensor().t()?)?
                .broadcast_add(self.b2.as_tensor());
        }
        let (dim, rank) = (x.dim(1)?, self.w1.dim(0)?);
        let xs = x.ge(0f32)?.to_dtype(DType::F32)?.affine(2.0, -1.0)?;
        let z = xs
            .matmul(&ste_sign(self.w1.as_tensor())?.t()?)?
            .broadcast_add(self.b1.as_tensor())?;
        // Scaled so the clipped identity's gradient window covers a useful range of z.
        let h = ste_sign(&(z / (dim as f64).sqrt())?)?;
        let dot = h.matmul(&ste_sign(self.w2.as_tensor())?.t()?)?;
        let ab = self.b2.as_tensor();
        (dot / (rank as f64).sqrt())?
            .broadcast_mul(&ab.narrow(0, 0, 1)?)?
            .broadcast_add(&ab.narrow(0, 1, 1)?)
    }

    fn export(&self, dim: usize, n: usize, read: u32) -> Result<MlpNet> {
        let rank = self.b1.dim(0)?;
        let weights = if self.binary {
            let bits = |w: &Var, rows: usize, cols: usize| -> Result<Vec<u64>> {
                let v = w.as_tensor().flatten_all()?.to_vec1::<f32>()?;
                let words = cols.div_ceil(64);
                let mut out = vec![0u64; rows * words];
                for r in 0..rows {
                    for c in 0..cols {
                        if v[r * cols + c] >= 0.0 {
                            out[r * words + c / 64] |= 1 << (c % 64);
                        }
                    }
                }
                Ok(out)
            };
            // z = dot + b >= 0  <=>  agree >= (dim - b) / 2  <=>  agree > ceil((dim - b) / 2) - 1.
            let b = self.b1.as_tensor().to_vec1::<f32>()?;
            let thr1 = b
                .iter()
                .map(|&b| (((dim as f32 - b) / 2.0).ceil() - 1.0).clamp(0.0, dim as f32) as u16)
                .collect();
            MlpWeights::Binary {
                w1: bits(&self.w1, rank, dim)?,
                thr1,
                w2: bits(&self.w2, n, rank)?,
            }
        } else {
            let v = |w: &Var| w.as_tensor().flatten_all()?.to_vec1::<f32>();
            MlpWeights::Real {
                w1: v(&self.w1)?,
                b1: v(&self.b1)?,
                w2: v(&self.w2)?,
                b2: v(&self.b2)?,
            }
        };
        Ok(MlpNet { weights, read })
    }
}

fn err(e: candle_core::Error) -> String {
    format!("training: {e}")
}

/// Trains one MLP per layer of `trace` against the oracle sets at `thresholds`;
/// `progress(layer, first loss, last loss, read, recall)` after each.
pub fn train_mlp(
    trace: &TraceReader,
    model_name: &str,
    thresholds: &[f32],
    o: &MlpOptions,
    progress: &mut dyn FnMut(usize, f32, f32, u32, f64),
) -> std::result::Result<MlpPredictorTable, String> {
    let (nl, dim, n, tn) = (trace.layers, trace.dim, trace.hidden, trace.tokens);
    if thresholds.len() != nl {
        return Err(format!("{} thresholds for {nl} layers", thresholds.len()));
    }
    if !(1..=MAX_RANK).contains(&o.rank) {
        return Err(format!("--rank {}: 1 to {MAX_RANK}", o.rank));
    }
    if o.epochs == 0 || o.batch == 0 || tn == 0 {
        return Err("no training: epochs, batch and tokens must be at least 1".into());
    }
    if o.binary && dim > MAX_RANK {
        return Err(format!(
            "a binarized MLP takes up to {MAX_RANK} inputs, not {dim}"
        ));
    }
    let mut table = MlpPredictorTable {
        model: model_name.to_string(),
        dim: dim as u32,
        neurons: n as u32,
        rank: o.rank as u32,
        input: o.input,
        binary: o.binary,
        sparsity: o.sparsity,
        target_recall: o.target_recall,
        seed: o.seed,
        layers: Vec::new(),
    };
    let inputs = Inputs::new(trace)?;
    let acts = trace.tensor("neuron_act")?;
    let dev = Device::Cpu;
    let (mut hidden, mut scores) = (vec![0f32; MAX_RANK], vec![0f32; n]);
    for (l, &thr) in thresholds.iter().enumerate() {
        let (x, y) = data::layer_set(trace, &inputs, o.input, l, thr)?;
        let mut rng = Rng::new(o.seed ^ (l as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
        let base = base_logits(&y, n);
        let mut fit = || -> Result<(Mlp, f32, f32)> {
            let xt = Tensor::from_slice(&x, (tn, dim), &dev)?;
            let yt = Tensor::from_slice(&y, (tn, n), &dev)?;
            let net = Mlp::new(dim, o.rank, n, o.binary, &base, &mut rng)?;
            let (first, last) = descend(
                net.vars(),
                (&xt, &yt),
                (o.epochs, o.batch, o.lr),
                &mut rng,
                |xb, yb, _| bce(&net.forward(xb)?, yb),
                || Ok(()),
            )?;
            Ok((net, first, last))
        };
        let (net, first, last) = fit().map_err(err)?;
        table
            .layers
            .push(net.export(dim, n, n as u32).map_err(err)?);
        let at = table.layers.len() - 1;
        let sets = oracle_sets(acts, nl, n, l, thr);
        let curve = recall_curve_ranked(n, &sets, |t, order| {
            table.scores(at, inputs.row(o.input, t, l), &mut hidden, &mut scores);
            order.clear();
            order.extend(0..n as u32);
            // As `mlp::top_read` ranks: score descending, ties to the lower index.
            order.sort_by(|&a, &b| {
                scores[b as usize]
                    .total_cmp(&scores[a as usize])
                    .then(a.cmp(&b))
            });
        });
        let read = (1..=n)
            .find(|&r| curve[r] >= o.target_recall as f64 - 1e-12)
            .unwrap_or(n);
        table.layers[at].read = read as u32;
        progress(l, first, last, read as u32, curve[read]);
    }
    table.validate()?;
    Ok(table)
}

/// A baseline's table in `predictor_report`'s harness.
pub struct MlpReport {
    pub table: MlpPredictorTable,
    hidden: Vec<f32>,
    scores: Vec<f32>,
    order: Vec<u32>,
    out: Vec<u32>,
}

impl MlpReport {
    pub fn new(table: MlpPredictorTable) -> MlpReport {
        let n = table.neurons as usize;
        MlpReport {
            hidden: vec![0.0; MAX_RANK],
            scores: vec![0.0; n],
            order: vec![0; n],
            out: vec![0; n],
            table,
        }
    }
}

impl super::predictor_report::Predictor for MlpReport {
    fn name(&self) -> String {
        self.table.name().into()
    }
    fn input(&self) -> PredictorInput {
        self.table.input
    }
    fn layer_bytes(&self, l: usize) -> usize {
        let one = MlpPredictorTable {
            layers: vec![self.table.layers[l].clone()],
            ..self.table.clone()
        };
        one.bytes()
    }
    fn predict(&mut self, l: usize, x: &[f32], read: &mut Vec<u32>) {
        self.table.scores(l, x, &mut self.hidden, &mut self.scores);
        let k = top_read(
            &self.scores,
            self.table.layers[l].read as usize,
            &mut self.order,
            &mut self.out,
        );
        read.clear();
        read.extend_from_slice(&self.out[..k]);
    }
    fn describe(&self) -> serde_json::Value {
        let t = &self.table;
        serde_json::json!({
            "rank": t.rank, "binary": t.binary, "input": format!("{:?}", t.input),
            "trained_sparsity": t.sparsity, "target_recall": t.target_recall, "seed": t.seed,
            "read": t.layers.iter().map(|n| n.read).collect::<Vec<_>>(),
        })
    }
}
