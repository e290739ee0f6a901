//! The trainable graph of one layer's predictor (paper 3.3.2), in candle.
//!
//! Every quantity the integer inference (`leanstream::predict::hash`) uses is computed here in
//! two parts: its hard value, exactly what the exported table gives (bits, bucket indices,
//! binary rows), and a soft surrogate that carries the gradient. The straight-through form
//! `hard + (soft - soft.detach())` has the hard value forward (x - x is exactly 0) and the
//! soft one's gradient backward:
//! - a sign (table entries, binary hyperplanes): soft = clamp(latent, -1, 1);
//! - a head's bucket: hard = one-hot of the index its tau sign bits make; soft = gumbel-softmax
//!   over the 2^tau buckets with the paper's eq. 12 logits, z . c for every sign code c (whose
//!   argmax is the hard bucket);
//! - the first projection: the int8 per-column quantization of PCA * W (soft: unquantized).
//!
//! The last layer's latent rows are the per-neuron logits of each head's bucket (BCE against
//! the oracle set); exported, a neuron's bit is the sign of its logit.

use super::pca::Pca;
use super::rng::Rng;
use candle_core::{DType, Device, Result, Tensor, Var};

/// The predictor's shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub dim: usize,
    pub pca: usize,
    pub heads: usize,
    pub tau: usize,
    pub depth: usize,
    pub out_heads: usize,
    pub out_tau: usize,
    pub neurons: usize,
}

impl Shape {
    /// Hash bits of a (first or middle) layer.
    pub fn cols(&self) -> usize {
        self.heads * self.tau
    }
    /// d: the binary width between layers.
    pub fn d(&self) -> usize {
        64 * self.heads
    }
}

/// A middle layer's latent hyperplanes [cols, d], offsets [cols] (in units of sqrt(d)) and
/// tables [heads, 2^tau, 64].
pub struct Middle {
    pub w: Var,
    pub b: Var,
    pub table: Var,
}

pub struct Net {
    pub shape: Shape,
    /// The fixed PCA: mean [1, dim], whitened basis [dim, pca].
    pub mean: Tensor,
    pub basis: Tensor,
    /// The first layer: W [pca, cols], bias [cols], tables [heads, 2^tau, 64].
    pub w1: Var,
    pub b1: Var,
    pub t1: Var,
    pub middle: Vec<Middle>,
    /// The last layer: hyperplanes [oh*ot, d], offsets [oh*ot], logits [oh, 2^ot, neurons].
    pub wo: Var,
    pub bo: Var,
    pub to: Var,
    /// Per output head, the logit its bits are set at [oh, 1, 1] (see [`vote_levels`]).
    pub levels: Tensor,
}

/// The logit at which each of `heads` output heads sets a neuron's bit. With `spread`, head h
/// votes when the neuron's probability in its bucket exceeds (h + 1/2) / heads, so the score
/// (the votes) is a quantized probability and ranks the neurons finely (the paper's
/// equal-probability bins); without, every head votes at probability 1/2.
pub fn vote_levels(heads: usize, spread: bool) -> Vec<f32> {
    (0..heads)
        .map(|h| {
            if spread {
                let p = (h as f64 + 0.5) / heads as f64;
                (p / (1.0 - p)).ln() as f32
            } else {
                0.0
            }
        })
        .collect()
}

/// The first layer's projection as the table stores it.
pub struct Projection {
    /// The int8 values (as f32) [dim, cols], their scale [1, cols], the bias [1, cols].
    pub q: Tensor,
    pub scale: Tensor,
    pub bias: Tensor,
    /// The straight-through projection (value: q * scale) for the soft path.
    pub w: Tensor,
}

/// Training-time settings of one forward pass.
pub struct Soft<'a> {
    pub rng: &'a mut Rng,
    pub temperature: f64,
}

/// One forward pass: the last layer's logits [oh, N, neurons] through the straight-through
/// selection, and the hard selection [oh, N, 2^ot] (one-hot rows).
pub struct Output {
    pub logits: Tensor,
    pub hard: Tensor,
}

fn var(v: Vec<f32>, shape: &[usize]) -> Result<Var> {
    Var::from_tensor(&Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// 1.0 where t >= 0, else 0.0.
pub fn bit01(t: &Tensor) -> Result<Tensor> {
    t.ge(0f32)?.to_dtype(DType::F32)
}

/// +1 where t >= 0, else -1, with the clipped identity's gradient.
fn ste_sign(t: &Tensor) -> Result<Tensor> {
    let hard = bit01(t)?.affine(2.0, -1.0)?;
    let soft = t.clamp(-1f32, 1f32)?;
    hard + (&soft - soft.detach())?
}

/// The 2^tau sign codes [tau, 2^tau] (column r: +1 where bit t of r is set) and the powers of
/// two [tau, 1] that turn bits into an index.
fn codes(tau: usize) -> Result<(Tensor, Tensor)> {
    let r = 1usize << tau;
    let mut c = vec![0f32; tau * r];
    for t in 0..tau {
        for (i, v) in c[t * r..(t + 1) * r].iter_mut().enumerate() {
            *v = if i >> t & 1 == 1 { 1.0 } else { -1.0 };
        }
    }
    let pow: Vec<f32> = (0..tau).map(|t| (1u32 << t) as f32).collect();
    Ok((
        Tensor::from_vec(c, (tau, r), &Device::Cpu)?,
        Tensor::from_vec(pow, (tau, 1), &Device::Cpu)?,
    ))
}

/// Each head's bucket from `z_hard` [N, heads*tau] (bit t of head h: z >= 0), as a selection
/// [heads, N, 2^tau]: one-hot, plus with `soft` the gumbel-softmax over eq. 12's logits of
/// `z_soft` for the gradient.
fn select(
    z_hard: &Tensor,
    z_soft: &Tensor,
    heads: usize,
    tau: usize,
    soft: Option<&mut Soft>,
) -> Result<Tensor> {
    let n = z_hard.dim(0)?;
    let r = 1usize << tau;
    let (code, pow) = codes(tau)?;
    let idx = bit01(z_hard)?.reshape((n * heads, tau))?.matmul(&pow)?;
    let all = Tensor::arange(0u32, r as u32, &Device::Cpu)?
        .to_dtype(DType::F32)?
        .reshape((1, r))?;
    let hard = idx.broadcast_eq(&all)?.to_dtype(DType::F32)?;
    let sel = match soft {
        None => hard,
        Some(s) => {
            let mut logits = z_soft.reshape((n * heads, tau))?.matmul(&code)?;
            let noise: Vec<f32> = (0..n * heads * r).map(|_| s.rng.gumbel()).collect();
            logits = (logits + Tensor::from_vec(noise, (n * heads, r), &Device::Cpu)?)?;
            let p = candle_nn::ops::softmax_last_dim(&(logits / s.temperature)?)?;
            (hard + (&p - p.detach())?)?
        }
    };
    sel.reshape((n, heads, r))?.transpose(0, 1)?.contiguous()
}

/// The rows a selection [heads, N, R] picks from `table` [heads, R, W], side by side [N, heads*W].
fn lookup(sel: &Tensor, table: &Tensor) -> Result<Tensor> {
    let (h, n, _) = sel.dims3()?;
    let w = table.dim(2)?;
    sel.matmul(table)?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((n, h * w))
}

/// Latent tables [heads, 2^tau, 64] whose row r holds r's bits: column j carries bit j % tau.
fn pass_table(heads: usize, tau: usize) -> Vec<f32> {
    let r = 1usize << tau;
    let mut v = Vec::with_capacity(heads * r * 64);
    for _ in 0..heads {
        for row in 0..r {
            v.extend((0..64).map(|j| if row >> (j % tau) & 1 == 1 { 0.5 } else { -0.5 }));
        }
    }
    v
}

/// Latent hyperplanes [sources.len(), 64 * heads] over rows laid out as [`pass_table`] makes
/// them: plane k reads hash bit `sources[k]` (head * tau + bit), +1 on that bit's columns,
/// and +-1 alternately on every other bit's columns, whose copies so cancel in the dot product.
fn read_planes(sources: &[usize], heads: usize, tau: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(sources.len() * heads * 64);
    for &src in sources {
        for c in 0..heads * 64 {
            let (h, j) = (c / 64, c % 64);
            let bit = h * tau + j % tau;
            let plus = bit == src || (j / tau).is_multiple_of(2);
            v.push(if plus { 0.5 } else { -0.5 });
        }
    }
    v
}

impl Net {
    /// A fresh net over the fitted PCA: first hyperplanes `w1` [pca, cols], and every later layer set
    /// to pass the first layer's sign bits on (tables that copy a bucket's bits into its row,
    /// middle hyperplanes that read one bit each), the last layer's hyperplanes each reading
    /// one of those bits (drawn from `rng`) and its rows at the neurons' logits `base`. The
    /// untrained stack is so a plain multi-table LSH of the projected input (similar inputs,
    /// similar rows), which training then refines.
    pub fn new(
        shape: Shape,
        pca: Pca,
        w1: Vec<f32>,
        base: &[f32],
        levels: &[f32],
        rng: &mut Rng,
    ) -> Result<Net> {
        let (p, cols, d) = (shape.pca, shape.cols(), shape.d());
        let (h, r) = (shape.heads, 1usize << shape.tau);
        let (oc, orows) = (shape.out_heads * shape.out_tau, 1usize << shape.out_tau);
        let table = pass_table(h, shape.tau);
        let same: Vec<usize> = (0..cols).collect();
        let mut middle = Vec::new();
        let w1 = var(w1, &[p, cols])?;
        let b1 = var(vec![0.0; cols], &[cols])?;
        let t1 = var(table.clone(), &[h, r, 64])?;
        for _ in 0..shape.depth.saturating_sub(2) {
            middle.push(Middle {
                w: var(read_planes(&same, h, shape.tau), &[cols, d])?,
                b: var(vec![0.0; cols], &[cols])?,
                table: var(table.clone(), &[h, r, 64])?,
            });
        }
        let mut picks = Vec::with_capacity(oc);
        for _ in 0..shape.out_heads {
            let mut pool: Vec<usize> = (0..cols).collect();
            rng.shuffle(&mut pool);
            picks.extend((0..shape.out_tau).map(|t| pool[t % cols]));
        }
        Ok(Net {
            shape,
            mean: pca.mean,
            basis: pca.basis,
            w1,
            b1,
            t1,
            middle,
            wo: var(read_planes(&picks, h, shape.tau), &[oc, d])?,
            bo: var(vec![0.0; oc], &[oc])?,
            to: var(
                rng.normals(shape.out_heads * orows * shape.neurons, 0.01)
                    .iter()
                    .zip(base.iter().cycle())
                    .map(|(e, b)| e + b)
                    .collect(),
                &[shape.out_heads, orows, shape.neurons],
            )?,
            levels: Tensor::from_slice(levels, (shape.out_heads, 1, 1), &Device::Cpu)?,
        })
    }

    pub fn vars(&self) -> Vec<Var> {
        let mut v = vec![self.w1.clone(), self.b1.clone(), self.t1.clone()];
        for m in &self.middle {
            v.extend([m.w.clone(), m.b.clone(), m.table.clone()]);
        }
        v.extend([self.wo.clone(), self.bo.clone(), self.to.clone()]);
        v
    }

    /// Keeps every binary layer's offset where the table's thresholds can say it exactly
    /// (|offset| <= d - 1 in dot-product units).
    pub fn clamp_offsets(&self) -> Result<()> {
        let d = self.shape.d() as f64;
        let lim = ((d - 1.0) / d.sqrt()) as f32;
        for b in self.middle.iter().map(|m| &m.b).chain([&self.bo]) {
            b.set(&b.as_tensor().clamp(-lim, lim)?)?;
        }
        Ok(())
    }

    /// A binary layer's offsets in dot-product units (the exported thresholds come from these).
    pub fn offsets(&self, b: &Var) -> Result<Tensor> {
        b.as_tensor().affine((self.shape.d() as f64).sqrt(), 0.0)
    }

    pub fn projection(&self) -> Result<Projection> {
        let cols = self.shape.cols();
        let w = self.basis.matmul(self.w1.as_tensor())?;
        let amax = w.abs()?.max_keepdim(0)?.detach();
        let scale = (amax / 127.0)?.clamp(1e-30f32, f32::MAX)?;
        let q = w
            .detach()
            .broadcast_div(&scale)?
            .round()?
            .clamp(-127f32, 127f32)?;
        let wq = q.broadcast_mul(&scale)?;
        let w_ste = (&w + (wq - &w)?.detach())?;
        let bias = self
            .b1
            .as_tensor()
            .reshape((1, cols))?
            .broadcast_sub(&self.mean.matmul(&w_ste)?)?;
        Ok(Projection {
            q,
            scale,
            bias,
            w: w_ste,
        })
    }

    /// A binary hashing layer over y [N, d] (values +-1): z = y . sign(w) + offset, hard and
    /// scaled soft.
    fn binary_hash(&self, y: &Tensor, w: &Var, b: &Var) -> Result<(Tensor, Tensor)> {
        let wb = ste_sign(w.as_tensor())?;
        let z = y.matmul(&wb.t()?)?.broadcast_add(&self.offsets(b)?)?;
        Ok((z.detach(), (&z / (self.shape.d() as f64).sqrt())?))
    }

    /// The forward pass over inputs x [N, dim]; `soft` (training) adds the gumbel noise and
    /// the straight-through gradients of the bucket choices.
    pub fn forward(&self, x: &Tensor, mut soft: Option<&mut Soft>) -> Result<Output> {
        let s = self.shape;
        let p = self.projection()?;
        let z_hard = x
            .matmul(&p.q)?
            .broadcast_mul(&p.scale)?
            .broadcast_add(&p.bias.detach())?;
        let z_soft = x.matmul(&p.w)?.broadcast_add(&p.bias)?;
        let sel = select(&z_hard, &z_soft, s.heads, s.tau, soft.as_deref_mut())?;
        let mut y = lookup(&sel, &ste_sign(self.t1.as_tensor())?)?;
        for m in &self.middle {
            let (zh, zs) = self.binary_hash(&y, &m.w, &m.b)?;
            let sel = select(&zh, &zs, s.heads, s.tau, soft.as_deref_mut())?;
            y = lookup(&sel, &ste_sign(m.table.as_tensor())?)?;
        }
        let (zh, zs) = self.binary_hash(&y, &self.wo, &self.bo)?;
        let sel = select(&zh, &zs, s.out_heads, s.out_tau, soft)?;
        Ok(Output {
            logits: sel.matmul(self.to.as_tensor())?,
            hard: sel.detach(),
        })
    }

    /// The last layer's rows as bits [oh, 2^ot, neurons]: logit at or over the head's level.
    pub fn out_bits(&self) -> Result<Tensor> {
        bit01(&self.to.as_tensor().broadcast_sub(&self.levels)?)
    }

    /// Every neuron's score [N, neurons]: how many output heads' rows have its bit set; what
    /// `HashPredictorTable::scores` gives on the exported table.
    pub fn scores(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.forward(x, None)?;
        out.hard.matmul(&self.out_bits()?)?.sum(0)
    }
}

/// Mean binary cross-entropy of `logits` [oh, N, n] against the 0/1 `labels` [N, n], in the
/// stable form max(x, 0) - x y + ln(1 + e^-|x|).
pub fn bce(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let xy = logits.broadcast_mul(labels)?;
    let soft = (logits.abs()?.neg()?.exp()? + 1.0)?.log()?;
    ((logits.relu()? - xy)? + soft)?.mean_all()
}
