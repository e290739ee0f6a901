//! The first hashing layer's fixed input projection: the top `k` principal directions of the
//! layer's inputs (paper 3.3.1: 30% of the dimensions), whitened so that every kept direction
//! has unit variance in the training data, and the inputs' mean.
//!
//! The directions come from subspace iteration on the covariance (orthonormalized each round
//! through a Cholesky factor), then the basis is whitened with the Cholesky factor of the
//! covariance restricted to it. Only the span of the top directions matters here: the learned
//! matrix W behind it mixes them anyway, so no eigensolver is needed.

use candle_core::{Device, Tensor};

/// `mean` [1, dim] and `basis` [dim, k]: ((x - mean) basis) has identity covariance.
pub struct Pca {
    pub mean: Tensor,
    pub basis: Tensor,
}

/// Lower Cholesky factor of the symmetric `k` x `k` matrix `a` (row-major), with a jitter on
/// the diagonal (1e-5 of its mean) for directions of no variance: fewer training tokens than
/// kept dimensions leave some, and whitening must not blow them up.
fn cholesky(a: &[f64], k: usize) -> Vec<f64> {
    let trace: f64 = (0..k).map(|i| a[i * k + i]).sum::<f64>() / k as f64;
    let jitter = 1e-5 * trace.max(1e-30);
    let mut l = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let mut s = a[i * k + j];
            for p in 0..j {
                s -= l[i * k + p] * l[j * k + p];
            }
            if i == j {
                l[i * k + i] = (s + jitter).max(jitter).sqrt();
            } else {
                l[i * k + j] = s / l[j * k + j];
            }
        }
    }
    l
}

/// The inverse of the transposed lower factor: L^-T, upper triangular (row-major).
fn inv_lt(l: &[f64], k: usize) -> Vec<f64> {
    // Solve L M = I for M = L^-1 (lower), then transpose.
    let mut m = vec![0f64; k * k];
    for c in 0..k {
        for i in c..k {
            let mut s = if i == c { 1.0 } else { 0.0 };
            for p in c..i {
                s -= l[i * k + p] * m[p * k + c];
            }
            m[i * k + c] = s / l[i * k + i];
        }
    }
    let mut t = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..k {
            t[j * k + i] = m[i * k + j];
        }
    }
    t
}

fn to_f64(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    Ok(t.flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(|v| v as f64)
        .collect())
}

fn from_f64(v: &[f64], rows: usize, cols: usize) -> candle_core::Result<Tensor> {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(f, (rows, cols), &Device::Cpu)
}

/// Fits the projection of `x` [N, dim] to `k` dimensions; `start` is the initial basis
/// ([dim, k], random: from the training's seeded generator).
pub fn fit(x: &Tensor, k: usize, start: Vec<f32>) -> candle_core::Result<Pca> {
    let (n, dim) = x.dims2()?;
    let mean = x.mean_keepdim(0)?;
    let xc = x.broadcast_sub(&mean)?;
    let cov = (xc.t()?.matmul(&xc)? / n.max(1) as f64)?;
    let mut q = Tensor::from_vec(start, (dim, k), &Device::Cpu)?;
    let eye = Tensor::eye(dim, candle_core::DType::F32, &Device::Cpu)?;
    for _ in 0..12 {
        q = orthonormalize(&cov.matmul(&q)?, &eye)?;
    }
    // Whiten within the span: basis^T cov basis = I.
    let basis = orthonormalize(&q, &cov)?;
    Ok(Pca { mean, basis })
}

/// The columns of `y` [dim, k] made orthonormal in the metric `m` [dim, dim] (spanning the same
/// space).
fn orthonormalize(y: &Tensor, m: &Tensor) -> candle_core::Result<Tensor> {
    let k = y.dim(1)?;
    let g = to_f64(&y.t()?.matmul(&m.matmul(y)?)?)?;
    let r = inv_lt(&cholesky(&g, k), k);
    y.matmul(&from_f64(&r, k, k)?)
}

/// `k` unit hyperplanes [pca dims, k] for the first hashing layer: random within the span of
/// the top directions along which the projected inputs predict the labels linearly (the
/// reduced-rank regression's: the top left singular vectors of X^T Y, X whitened and Y
/// centred), so the untrained hashes already split the tokens where their neuron sets differ.
/// `start` and `mix` are random ([p, min(k, p)] and [min(k, p), k]).
pub fn predictive_planes(
    x: &Tensor,
    y: &Tensor,
    pca: &Pca,
    k: usize,
    start: Vec<f32>,
    mix: Vec<f32>,
) -> candle_core::Result<Vec<f32>> {
    let xw = x.broadcast_sub(&pca.mean)?.matmul(&pca.basis)?;
    let p = xw.dim(1)?;
    let k2 = k.min(p);
    let yc = y.broadcast_sub(&y.mean_keepdim(0)?)?;
    let m = xw.t()?.matmul(&yc)?; // [p, n]
    let sub = fit(&m.t()?.contiguous()?, k2, start)?.basis;
    let eye = Tensor::eye(p, candle_core::DType::F32, &Device::Cpu)?;
    let q = orthonormalize(&sub, &eye)?;
    let w = q.matmul(&Tensor::from_vec(mix, (k2, k), &Device::Cpu)?)?;
    let norm = w.sqr()?.sum_keepdim(0)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
    w.broadcast_div(&norm)?.flatten_all()?.to_vec1::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::train::rng::Rng;

    #[test]
    fn fewer_samples_than_dimensions_give_a_finite_basis() {
        let (n, dim, k) = (20, 64, 30);
        let mut r = Rng::new(4);
        let x = Tensor::from_vec(r.normals(n * dim, 1.0), (n, dim), &Device::Cpu).unwrap();
        let p = fit(&x, k, r.normals(dim * k, 1.0)).unwrap();
        let b = p.basis.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(
            b.iter().all(|v| v.is_finite()),
            "a basis entry is not finite"
        );
    }

    #[test]
    fn the_kept_directions_are_the_largest_and_come_out_white() {
        // Data of variance 9, 4 along two axes and 0.01 along the rest.
        let (n, dim) = (2000, 6);
        let mut r = Rng::new(3);
        let sd = [3.0, 0.1, 2.0, 0.1, 0.1, 0.1];
        let mut v = Vec::new();
        for _ in 0..n {
            for s in sd {
                v.push((r.normal() * s + 5.0) as f32);
            }
        }
        let x = Tensor::from_vec(v, (n, dim), &Device::Cpu).unwrap();
        let p = fit(&x, 2, r.normals(dim * 2, 1.0)).unwrap();
        let b = p.basis.to_vec2::<f32>().unwrap();
        // The basis lives on axes 0 and 2.
        for (i, row) in b.iter().enumerate() {
            if i != 0 && i != 2 {
                assert!(row.iter().all(|v| v.abs() < 0.05), "axis {i}: {row:?}");
            }
        }
        let z = x.broadcast_sub(&p.mean).unwrap().matmul(&p.basis).unwrap();
        let c = (z.t().unwrap().matmul(&z).unwrap() / n as f64)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (i, row) in c.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-3, "cov[{i}][{j}] = {v}");
            }
        }
    }
}
