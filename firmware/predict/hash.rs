//! Stacked learnable hashing (LeanStream paper 3.3.1): which neurons a layer's FFN will use,
//! predicted with integer bit work from a table made offline (`leanstream train-predictor`).
//!
//! One net per model layer, `depth` hashing layers:
//! 1. the first hashes the input x (the layer's FFN input, or the residual: [`PredictorInput`])
//!    with `heads` hyperplane hashes of `tau` bits each: bit t of head h is
//!    sign(x . P[:, h*tau + t] + bias). P is the PCA projection (fitted offline, 30% of the
//!    dimensions kept) multiplied into the layer's learned matrix W, so x is projected once
//!    and the table stores one int8 matrix with a scale per column (the product is exact; it
//!    keeps the table small: dim x heads*tau instead of dim x 0.3 dim).
//!    Each head's tau bits index its own table of 2^tau learned 64-bit rows; the heads' rows
//!    side by side are the layer's output y: d = 64 * heads bits.
//! 2. each middle layer hashes y with binary hyperplanes: bit t of head h is set when y agrees
//!    with the learned binary vector w_{h,t} in more than `thr` places (XNOR and popcount:
//!    popcount(!(y ^ w)) > thr, the sign of the +-1 dot product against a learned offset), and
//!    looks up 64-bit rows as the first layer does.
//! 3. the last layer hashes y the same way with `out_heads` heads of `out_tau` bits; each head's
//!    index picks a row of one bit per neuron (multi-label classification: "this neuron is
//!    active"). A neuron's score is how many heads vote for it (0..=out_heads).
//!
//! The layer reads the `read` neurons of highest score (ties to the lower index): `read` is
//! set offline for the recall the table was trained to (the loading redundancy it costs).
//! Inference allocates nothing: the working bits live in fixed arrays on the stack.

use crate::tables::{self, TableError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The table file's kind and format version (`crate::tables`).
pub const KIND: &str = "hashpred";
/// 2: residual inputs are read divided by their RMS ([`PredictorInput::scale`]).
pub const VERSION: u32 = 2;

/// Most heads a hashing layer may have (d = 64 * heads bits), and most bits per hash.
pub const MAX_HEADS: usize = 8;
pub const MAX_TAU: usize = 12;
/// Most output heads (a score is a count of them).
pub const MAX_OUT_HEADS: usize = 16;

/// What a predictor reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PredictorInput {
    /// h_n, the layer's FFN input (normed residual): the current context.
    FfnInput,
    /// x_n, the residual entering layer n's FFN (before the norm).
    Residual,
    /// x_{n-1}, the residual entering the previous layer's FFN (for layer 0: layer 0's own):
    /// known one layer ahead, so the reads can start before the layer (the stale context).
    PrevResidual,
    /// h_{n-1}, the previous layer's FFN input (for layer 0: layer 0's own): the stale context
    /// as the streaming engine has it (DejaVu's DNN_stale).
    PrevFfnInput,
    /// x_{n-1} + FFN_{n-1}(h_{n-1}), the residual after the previous layer's FFN (for layer 0:
    /// x_0): the complete context of speculate-and-refine, whose partial sums after each stage
    /// of the previous FFN (paper eq. 2) approach it (`leanstream predictor-report --refine`).
    PrevFfnOutput,
}

impl PredictorInput {
    /// What the predictors multiply input `x` by: the residual inputs (before any norm) by
    /// 1 / RMS(x), so that every layer's input has one scale (the residual stream grows along
    /// the layers, and a few of its dimensions reach the hundreds in Qwen2.5: unscaled, the
    /// training diverges); the normed inputs by 1. Dividing twice changes nothing (the RMS of
    /// a scaled input is 1), so trainer and runtime may both apply it.
    pub fn scale(self, x: &[f32]) -> f32 {
        match self {
            PredictorInput::FfnInput | PredictorInput::PrevFfnInput => 1.0,
            PredictorInput::Residual
            | PredictorInput::PrevResidual
            | PredictorInput::PrevFfnOutput => {
                let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32;
                if ms > 0.0 && ms.is_finite() {
                    1.0 / ms.sqrt()
                } else {
                    1.0
                }
            }
        }
    }
}

/// One middle hashing layer over binary input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BinaryLayer {
    /// `heads * tau` binary hyperplanes of `in_heads` words each.
    pub w: Vec<u64>,
    /// Per hyperplane: the bit is set when more than `thr` input bits agree with it.
    pub thr: Vec<u16>,
    /// `heads` tables of 2^tau rows.
    pub table: Vec<u64>,
}

/// The predictor of one model layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HashNet {
    /// The first layer's projection, PCA times W: `dim` rows of `heads * tau` int8 columns.
    pub proj: Vec<i8>,
    /// Per column: the int8's scale, and the bias (minus the PCA mean's projection).
    pub proj_scale: Vec<f32>,
    pub proj_bias: Vec<f32>,
    /// The first layer's `heads` tables of 2^tau rows.
    pub first_table: Vec<u64>,
    /// `depth - 2` middle layers.
    pub middle: Vec<BinaryLayer>,
    /// The last layer: `out_heads * out_tau` hyperplanes of `heads` words, their thresholds,
    /// and `out_heads` tables of 2^out_tau rows of `words(neurons)` words.
    pub out_w: Vec<u64>,
    pub out_thr: Vec<u16>,
    pub out_table: Vec<u64>,
    /// Neurons read per token.
    pub read: u32,
}

/// A model's predictor table: one [`HashNet`] per layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HashPredictorTable {
    /// The model's name, for messages.
    pub model: String,
    pub dim: u32,
    pub neurons: u32,
    pub input: PredictorInput,
    /// Hashing layers per net (>= 2: the first and the last).
    pub depth: u8,
    pub heads: u8,
    pub tau: u8,
    pub out_heads: u8,
    pub out_tau: u8,
    /// The oracle's sparsity the labels were made at, and the recall `read` was set for.
    pub sparsity: f32,
    pub target_recall: f32,
    /// The training's seed and the PCA's kept dimensions (for the report).
    pub seed: u64,
    pub pca_dims: u32,
    pub layers: Vec<HashNet>,
}

fn words(bits: usize) -> usize {
    bits.div_ceil(64)
}

impl HashPredictorTable {
    /// Checks every size against the header's shape; a table that fails is damaged.
    pub fn validate(&self) -> Result<(), String> {
        let (dim, n) = (self.dim as usize, self.neurons as usize);
        if dim == 0 || n == 0 {
            return Err("zero dim or neurons".into());
        }
        let (s, depth) = (self.shape(), self.depth as usize);
        s.check(depth)?;
        for (l, net) in self.layers.iter().enumerate() {
            net.check(s, dim, n, depth)
                .map_err(|e| format!("layer {l}: {e}"))?;
        }
        Ok(())
    }

    /// The table's bytes as the daemon holds them (the report's "size").
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|n| {
                n.proj.len()
                    + 4 * (n.proj_scale.len() + n.proj_bias.len())
                    + 8 * n.first_table.len()
                    + n.middle
                        .iter()
                        .map(|m| 8 * (m.w.len() + m.table.len()) + 2 * m.thr.len())
                        .sum::<usize>()
                    + 8 * (n.out_w.len() + n.out_table.len())
                    + 2 * n.out_thr.len()
            })
            .sum()
    }

    pub fn encode(&self, model_id: u64) -> Vec<u8> {
        tables::encode(KIND, VERSION, model_id, self)
    }

    /// Decodes and checks a table for the model of identity `model_id` with `layers` layers of
    /// `dim` inputs and `neurons` neurons.
    pub fn decode(
        bytes: &[u8],
        model_id: u64,
        layers: usize,
        dim: usize,
        neurons: usize,
    ) -> Result<HashPredictorTable, TableError> {
        let t: HashPredictorTable = tables::decode(bytes, KIND, VERSION, model_id)?;
        super::check_shape((t.layers.len(), t.dim, t.neurons), (layers, dim, neurons))?;
        t.validate().map_err(TableError::Damaged)?;
        Ok(t)
    }

    pub fn read(
        path: &Path,
        model_id: u64,
        layers: usize,
        dim: usize,
        neurons: usize,
    ) -> Result<HashPredictorTable, TableError> {
        Self::decode(&tables::read_bytes(path)?, model_id, layers, dim, neurons)
    }

    /// Layer `l`'s score for every neuron (`out.len()` is `neurons`), from its input `x`.
    pub fn scores(&self, l: usize, x: &[f32], out: &mut [u8]) {
        assert_eq!(x.len(), self.dim as usize, "one input per dimension");
        assert_eq!(out.len(), self.neurons as usize, "one score per neuron");
        self.layers[l].scores(self.shape(), x, self.input.scale(x), out);
    }

    /// The hashing layers' shape, shared by every layer's net.
    pub fn shape(&self) -> HashShape {
        HashShape {
            heads: self.heads as usize,
            tau: self.tau as usize,
            out_heads: self.out_heads as usize,
            out_tau: self.out_tau as usize,
        }
    }
}

/// The hashing layers' widths (the table's header holds them for all its nets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashShape {
    pub heads: usize,
    pub tau: usize,
    pub out_heads: usize,
    pub out_tau: usize,
}

impl HashShape {
    /// Whether the widths are within what the inference's fixed arrays hold.
    pub fn check(&self, depth: usize) -> Result<(), String> {
        let (heads, tau, oh, ot) = (self.heads, self.tau, self.out_heads, self.out_tau);
        if !(1..=MAX_HEADS).contains(&heads) || !(1..=MAX_TAU).contains(&tau) {
            return Err(format!(
                "{heads} heads of {tau} bits: at most {MAX_HEADS} of {MAX_TAU}"
            ));
        }
        if !(1..=MAX_OUT_HEADS).contains(&oh) || !(1..=MAX_TAU).contains(&ot) {
            return Err(format!(
                "{oh} output heads of {ot} bits: at most {MAX_OUT_HEADS} of {MAX_TAU}"
            ));
        }
        if depth < 2 {
            return Err(format!("depth {depth}: at least 2"));
        }
        Ok(())
    }
}

impl HashNet {
    /// Checks the net's sizes for `dim` inputs, `n` outputs and `depth` hashing layers.
    pub fn check(&self, s: HashShape, dim: usize, n: usize, depth: usize) -> Result<(), String> {
        s.check(depth)?;
        let (heads, tau, oh, ot) = (s.heads, s.tau, s.out_heads, s.out_tau);
        let cols = heads * tau;
        let bad = |what: &str, got: usize, want: usize| {
            Err(format!("{what} has {got} entries, expected {want}"))
        };
        if self.proj.len() != dim * cols {
            return bad("proj", self.proj.len(), dim * cols);
        }
        if self.proj_scale.len() != cols {
            return bad("proj_scale", self.proj_scale.len(), cols);
        }
        if self.proj_bias.len() != cols {
            return bad("proj_bias", self.proj_bias.len(), cols);
        }
        if self.first_table.len() != heads << tau {
            return bad("first_table", self.first_table.len(), heads << tau);
        }
        if self.middle.len() != depth - 2 {
            return bad("middle", self.middle.len(), depth - 2);
        }
        for (k, m) in self.middle.iter().enumerate() {
            if m.w.len() != cols * heads || m.thr.len() != cols || m.table.len() != heads << tau {
                return Err(format!("middle layer {k} has the wrong shape"));
            }
        }
        if self.out_w.len() != oh * ot * heads {
            return bad("out_w", self.out_w.len(), oh * ot * heads);
        }
        if self.out_thr.len() != oh * ot {
            return bad("out_thr", self.out_thr.len(), oh * ot);
        }
        if self.out_table.len() != (oh << ot) * words(n) {
            return bad("out_table", self.out_table.len(), (oh << ot) * words(n));
        }
        if self.read == 0 || self.read as usize > n {
            return Err(format!("reads {} of {n} neurons", self.read));
        }
        if self
            .proj_scale
            .iter()
            .chain(&self.proj_bias)
            .any(|v| !v.is_finite())
        {
            return Err("a projection scale or bias is not finite".into());
        }
        Ok(())
    }

    /// Every output's score (votes) for the input `x` (`out.len()` outputs).
    pub fn scores(&self, s: HashShape, x: &[f32], x_scale: f32, out: &mut [u8]) {
        let net = self;
        let (heads, tau) = (s.heads, s.tau);
        let cols = heads * tau;

        // First layer: project, hash, look up.
        let mut z = [0f32; MAX_HEADS * MAX_TAU];
        let z = &mut z[..cols];
        match cols {
            16 => project::<16>(x, &net.proj, z),
            32 => project::<32>(x, &net.proj, z),
            64 => project::<64>(x, &net.proj, z),
            _ => {
                for (xi, row) in x.iter().zip(net.proj.chunks_exact(cols)) {
                    for (zc, &w) in z.iter_mut().zip(row) {
                        *zc += xi * w as f32;
                    }
                }
            }
        }
        let mut y = [0u64; MAX_HEADS];
        for (h, yh) in y.iter_mut().enumerate().take(heads) {
            let mut idx = 0usize;
            for t in 0..tau {
                let c = h * tau + t;
                if z[c] * x_scale * net.proj_scale[c] + net.proj_bias[c] >= 0.0 {
                    idx |= 1 << t;
                }
            }
            *yh = net.first_table[(h << tau) + idx];
        }
        // Middle layers: XNOR-popcount hashes over y.
        for m in &net.middle {
            let mut next = [0u64; MAX_HEADS];
            for (h, nh) in next.iter_mut().enumerate().take(heads) {
                let idx = hash_bits(&y[..heads], &m.w, &m.thr, h, tau);
                *nh = m.table[(h << tau) + idx];
            }
            y = next;
        }
        // Last layer: each head votes for the neurons of its row.
        out.fill(0);
        let (oh, ot) = (s.out_heads, s.out_tau);
        let nw = words(out.len());
        for h in 0..oh {
            let idx = hash_bits(&y[..heads], &net.out_w, &net.out_thr, h, ot);
            let row = &net.out_table[((h << ot) + idx) * nw..][..nw];
            add_votes(row, out);
        }
    }
}

/// z = x . proj (int8, `C` columns) for the usual widths: the sums stay in registers (with a
/// width known only at run time they went through memory on every input, half the layer's
/// time at 1,536 inputs). The same sums in the same order as the general loop.
fn project<const C: usize>(x: &[f32], proj: &[i8], z: &mut [f32]) {
    let mut acc = [0f32; C];
    for (xi, row) in x.iter().zip(proj.chunks_exact(C)) {
        for (a, &w) in acc.iter_mut().zip(row) {
            *a += xi * w as f32;
        }
    }
    z.copy_from_slice(&acc);
}

/// Byte j of `SPREAD[b]` is bit j of `b`: one byte of a vote row, spread over 8 scores.
const SPREAD: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            if (b >> j) & 1 == 1 {
                t[b] |= 1 << (8 * j);
            }
            j += 1;
        }
        b += 1;
    }
    t
};

/// Adds one head's vote row (bit j: neuron j) to the scores, 8 neurons per addition: a score
/// is at most `MAX_OUT_HEADS` (16), so no byte carries into the next. (One branch per set bit
/// cost ~20 us a layer at 8,960 neurons.)
fn add_votes(row: &[u64], out: &mut [u8]) {
    let whole = out.len() / 8 * 8;
    let (head, tail) = out.split_at_mut(whole);
    for (k, chunk) in head.chunks_exact_mut(8).enumerate() {
        let byte = (row[k / 8] >> (8 * (k % 8))) as u8;
        let sum =
            u64::from_le_bytes((&*chunk).try_into().expect("8 bytes")) + SPREAD[byte as usize];
        chunk.copy_from_slice(&sum.to_le_bytes());
    }
    for (i, o) in tail.iter_mut().enumerate() {
        let j = whole + i;
        *o += ((row[j / 64] >> (j % 64)) & 1) as u8;
    }
}

/// Head `h`'s index: bit t set when more than `thr` bits of `y` agree with hyperplane
/// `h * tau + t`.
fn hash_bits(y: &[u64], w: &[u64], thr: &[u16], h: usize, tau: usize) -> usize {
    let words = y.len();
    let mut idx = 0;
    for t in 0..tau {
        let c = h * tau + t;
        let plane = &w[c * words..][..words];
        let agree = super::agreement(y, plane);
        if agree > thr[c] as u32 {
            idx |= 1 << t;
        }
    }
    idx
}

/// The `read` highest scores' indices into `out` (ascending index), ties to the lower index;
/// returns how many (min(read, scores.len())). `count` is scratch of `max score + 1` entries.
pub fn top_scores(scores: &[u8], read: usize, count: &mut [u32], out: &mut [u32]) -> usize {
    let read = read.min(scores.len());
    // One counting pass per score value (a score is at most MAX_OUT_HEADS), in byte lanes over
    // runs of 255 (no lane overflows): compares that vectorize 16 or 32 to an instruction,
    // where `count[s] += 1` chains each increment on the last through memory.
    for (c, n) in count.iter_mut().enumerate() {
        let Ok(c) = u8::try_from(c) else {
            *n = 0;
            continue;
        };
        *n = scores
            .chunks(255)
            .map(|run| run.iter().map(|&s| (s == c) as u8).sum::<u8>() as u32)
            .sum();
    }
    debug_assert_eq!(
        count.iter().sum::<u32>() as usize,
        scores.len(),
        "a score over the count"
    );
    // The lowest score c still taken, and how many of it.
    let mut above = 0usize;
    let mut cut = 0usize;
    let mut at_cut = read;
    for c in (0..count.len()).rev() {
        let n = count[c] as usize;
        if above + n >= read {
            cut = c;
            at_cut = read - above;
            break;
        }
        above += n;
    }
    if read == 0 {
        return 0;
    }
    // Without branches on the scores, which are a coin toss to the branch predictor (as
    // long as the scoring itself): each index is written, and kept by advancing.
    let mut k = 0;
    for (j, &s) in scores.iter().enumerate() {
        out[k] = j as u32;
        let s = s as usize;
        let at = s == cut;
        let take = (s > cut) | (at & (at_cut > 0));
        at_cut -= (take & at) as usize;
        k += take as usize;
        if k == read {
            break;
        }
    }
    k
}

#[cfg(test)]
mod tests;
