//! Statistics of a trace for the sparsity report (`leanstream trace-stats`):
//!
//! - `share`: per layer, the fraction of the FFN's output magnitude the top 10/20/50% of
//!   neurons carry. A neuron's part of the output is |h_j| * ||down column j||_2; neurons are
//!   ranked by it, per token, and the shares averaged over tokens.
//! - `overlap`: per layer, |A_t ∩ A_{t-1}| / |A_t| for consecutive tokens of a window, A the
//!   oracle set (|h_j| at or over the layer's calibrated glu threshold) at each sparsity; and
//!   `active`: the fraction of neurons in A on this text.
//! - `refine`: predicting layer n+1's oracle set before it runs. A feature f (the residual x_n
//!   entering layer n's FFN, the one-shot DejaVu-style input, then x_n plus the first k of K
//!   stages of layer n's FFN, paper eq. 2) goes through layer n+1's own FFN norm, gate and up;
//!   the |SiLU(gate) * up| it gives ranks the neurons, and the top |A| are the guess (this is a
//!   training-free stand-in for the learned predictors). Per stage k = 0..K, stages taken in
//!   priority order (descending |h|) or in index order: `recall` = |guess ∩ A| / |A|, `top10`
//!   = recall of the true top 10% by the guessed top 10%, `importance` = sum of |h| over the
//!   guess / sum over A.

use super::oracle;
use super::trace::TraceReader;
use leanstream::backend::cpu::{matvec_many, ActScratch, KernelSet, Matrix, WorkerPool};
use leanstream::model::ggml::dequantize_row;
use leanstream::model::ModelFile;
use leanstream::ops::{rmsnorm, silu};
use leanstream::sparsity::thresholds::ThresholdTable;

fn fmt_vec(v: &[f64]) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
    format!("[{}]", s.join(", "))
}

fn fmt_mat(m: &[Vec<f64>]) -> String {
    let s: Vec<String> = m.iter().map(|r| fmt_vec(r)).collect();
    format!("[{}]", s.join(", "))
}

/// Indices of the `k` largest values (ties to the lower index).
fn top(values: &[f32], k: usize, scratch: &mut Vec<u32>) -> Vec<bool> {
    scratch.clear();
    scratch.extend(0..values.len() as u32);
    scratch.sort_unstable_by(|&a, &b| {
        values[b as usize]
            .total_cmp(&values[a as usize])
            .then(a.cmp(&b))
    });
    let mut sel = vec![false; values.len()];
    for &j in &scratch[..k.min(values.len())] {
        sel[j as usize] = true;
    }
    sel
}

/// Computes every statistic and returns them as JSON.
#[allow(clippy::needless_range_loop)]
pub fn trace_stats(
    trace: &TraceReader,
    model: &ModelFile,
    table: &ThresholdTable,
    sparsities: &[f32],
    threads: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<String, String> {
    let h = model.hyper().map_err(|e| e.to_string())?;
    let (tn, nl, dim, n, k) = (
        trace.tokens,
        trace.layers,
        trace.dim,
        trace.hidden,
        trace.stages,
    );
    if (nl, dim, n) != (h.n_layers, h.dim, h.hidden_dim) {
        return Err("the trace was recorded from another model shape".into());
    }
    let res = trace.tensor("ffn_residual")?;
    let act_h = trace.tensor("neuron_act")?;
    let stage_p = trace.tensor("stage_residual_priority")?;
    let stage_i = trace.tensor("stage_residual_index")?;
    let pos: Vec<i32> = (0..tn)
        .map(|t| trace.position(t))
        .collect::<Result<_, _>>()?;
    let hv = |t: usize, l: usize| &act_h[(t * nl + l) * n..][..n];
    let thr: Vec<Vec<f32>> = sparsities
        .iter()
        .map(|&s| oracle::thresholds(table, s))
        .collect::<Result<_, _>>()?;
    let t = |name: &str| model.tensor(name).map_err(|e| e.to_string());

    // Output magnitude per neuron: |h_j| * ||down column j||.
    let mut share = vec![vec![0f64; nl]; 3];
    let fracs = [0.1, 0.2, 0.5];
    let mut scratch = Vec::new();
    let mut norms = vec![vec![0f32; n]; nl];
    for (l, norm) in norms.iter_mut().enumerate() {
        let d = t(&format!("blk.{l}.ffn_down.weight"))?;
        let rb = d.ty.row_bytes(d.cols).ok_or("down rows")?;
        let mut row = vec![0f32; d.cols];
        let mut ss = vec![0f64; n];
        for r in 0..d.rows {
            dequantize_row(d.ty, &d.data[r * rb..][..rb], &mut row);
            for (s, v) in ss.iter_mut().zip(&row) {
                *s += (*v as f64) * (*v as f64);
            }
        }
        for (o, s) in norm.iter_mut().zip(&ss) {
            *o = s.sqrt() as f32;
        }
    }
    let mut contrib = vec![0f32; n];
    for ti in 0..tn {
        for l in 0..nl {
            for ((c, hj), nj) in contrib.iter_mut().zip(hv(ti, l)).zip(&norms[l]) {
                *c = hj.abs() * nj;
            }
            let total: f64 = contrib.iter().map(|&c| c as f64).sum();
            scratch.clear();
            let mut sorted: Vec<f32> = contrib.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            for (fi, f) in fracs.iter().enumerate() {
                let m = ((f * n as f64).round() as usize).max(1);
                let s: f64 = sorted[..m].iter().map(|&c| c as f64).sum();
                share[fi][l] += if total > 0.0 { s / total } else { 0.0 } / tn as f64;
            }
        }
    }

    // Active sets and their overlap from one token to the next.
    let mut overlap = vec![vec![0f64; nl]; sparsities.len()];
    let mut active = vec![vec![0f64; nl]; sparsities.len()];
    let pairs = (1..tn).filter(|&t| pos[t] > 0).count().max(1);
    for (si, th) in thr.iter().enumerate() {
        for l in 0..nl {
            for ti in 0..tn {
                let a = hv(ti, l);
                let size = a.iter().filter(|&&v| oracle::active(v, th[l])).count();
                active[si][l] += size as f64 / (n * tn) as f64;
                if ti > 0 && pos[ti] > 0 && size > 0 {
                    let b = hv(ti - 1, l);
                    let both = a
                        .iter()
                        .zip(b)
                        .filter(|(&x, &y)| oracle::active(x, th[l]) && oracle::active(y, th[l]))
                        .count();
                    overlap[si][l] += both as f64 / size as f64 / pairs as f64;
                }
            }
        }
    }

    // Refinement: guesses for layer n+1 from features of layer n.
    let pool = WorkerPool::new(threads.max(1));
    let mut act = ActScratch::new(dim.max(n));
    let mut z = vec![0f32; dim];
    let (mut g, mut u, mut score) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let zero = || vec![vec![vec![0f64; k + 1]; nl - 1]; sparsities.len()];
    // [order][metric][sparsity][layer][stage]
    let mut acc = [[zero(), zero(), zero()], [zero(), zero(), zero()]];
    let mut counts = vec![vec![0usize; nl - 1]; sparsities.len()];
    let mat = |name: String| -> Result<Matrix, String> {
        let tr = t(&name)?;
        Ok(Matrix {
            ty: tr.ty,
            q: None,
            rows: tr.rows,
            cols: tr.cols,
            data: tr.data,
        })
    };
    for l in 0..nl - 1 {
        let next = l + 1;
        let gate = mat(format!("blk.{next}.ffn_gate.weight"))?;
        let up = mat(format!("blk.{next}.ffn_up.weight"))?;
        let nt = t(&format!("blk.{next}.ffn_norm.weight"))?;
        let mut norm_w = vec![0f32; dim];
        dequantize_row(nt.ty, nt.data, &mut norm_w);
        for ti in 0..tn {
            let truth = hv(ti, next);
            let mag: Vec<f32> = truth.iter().map(|v| v.abs()).collect();
            let m10 = ((0.1 * n as f64).round() as usize).max(1);
            let top10 = top(&mag, m10, &mut scratch);
            let oracle: Vec<(Vec<bool>, usize, f64)> = thr
                .iter()
                .map(|th| {
                    let set: Vec<bool> =
                        truth.iter().map(|&v| oracle::active(v, th[next])).collect();
                    let size = set.iter().filter(|&&b| b).count();
                    let sum: f64 = mag
                        .iter()
                        .zip(&set)
                        .filter(|(_, &b)| b)
                        .map(|(&m, _)| m as f64)
                        .sum();
                    (set, size, sum)
                })
                .collect();
            for (oi, stages) in [stage_p, stage_i].iter().enumerate() {
                for s in 0..=k {
                    if oi == 1 && s == 0 {
                        // Stage 0 is the same feature in both orders (copied below).
                        continue;
                    }
                    let f = if s == 0 {
                        &res[(ti * nl + l) * dim..][..dim]
                    } else {
                        &stages[((ti * nl + l) * k + s - 1) * dim..][..dim]
                    };
                    rmsnorm(&mut z, f, &norm_w, h.norm_eps);
                    matvec_many(
                        KernelSet::best(),
                        &pool,
                        &mut [(&gate, &mut g[..]), (&up, &mut u[..])],
                        &z,
                        &mut act,
                    );
                    for ((sc, gv), uv) in score.iter_mut().zip(&g).zip(&u) {
                        *sc = (silu(*gv) * uv).abs();
                    }
                    let guess10 = top(&score, m10, &mut scratch);
                    let r10 = guess10
                        .iter()
                        .zip(&top10)
                        .filter(|(a, b)| **a && **b)
                        .count() as f64
                        / m10 as f64;
                    for (si, (set, size, sum)) in oracle.iter().enumerate() {
                        if *size == 0 {
                            continue;
                        }
                        let guess = top(&score, *size, &mut scratch);
                        let hit = guess.iter().zip(set).filter(|(a, b)| **a && **b).count();
                        let got: f64 = guess
                            .iter()
                            .zip(&mag)
                            .filter(|(a, _)| **a)
                            .map(|(_, &m)| m as f64)
                            .sum();
                        acc[oi][0][si][l][s] += hit as f64 / *size as f64;
                        acc[oi][1][si][l][s] += r10;
                        acc[oi][2][si][l][s] += if *sum > 0.0 { got / sum } else { 1.0 };
                        if oi == 0 && s == 0 {
                            counts[si][l] += 1;
                        }
                    }
                }
            }
            progress(l * tn + ti + 1);
        }
    }
    let [prio, index] = &mut acc;
    for (p, i) in prio.iter().zip(index.iter_mut()) {
        for (ps, is) in p.iter().zip(i.iter_mut()) {
            for (pl, il) in ps.iter().zip(is.iter_mut()) {
                il[0] = pl[0];
            }
        }
    }
    let mut refine = Vec::new();
    for (si, &s) in sparsities.iter().enumerate() {
        let mut orders = Vec::new();
        for (oi, name) in ["priority", "index"].iter().enumerate() {
            let mut metrics = Vec::new();
            for (mi, mname) in ["recall", "top10", "importance"].iter().enumerate() {
                let m: Vec<Vec<f64>> = (0..nl - 1)
                    .map(|l| {
                        acc[oi][mi][si][l]
                            .iter()
                            .map(|v| v / counts[si][l].max(1) as f64)
                            .collect()
                    })
                    .collect();
                metrics.push(format!("\"{mname}\": {}", fmt_mat(&m)));
            }
            orders.push(format!("\"{name}\": {{{}}}", metrics.join(", ")));
        }
        refine.push(format!("\"{s}\": {{{}}}", orders.join(", ")));
    }
    let per_s = |v: &[Vec<f64>]| {
        let parts: Vec<String> = sparsities
            .iter()
            .zip(v)
            .map(|(s, r)| format!("\"{s}\": {}", fmt_vec(r)))
            .collect();
        format!("{{{}}}", parts.join(", "))
    };
    Ok(format!(
        "{{\n  \"model\": {:?},\n  \"tokens\": {tn},\n  \"layers\": {nl},\n  \"hidden\": {n},\n  \"stages\": {k},\n  \"trace_sparsity\": {:?},\n  \"share\": {{\"0.1\": {}, \"0.2\": {}, \"0.5\": {}}},\n  \"active\": {},\n  \"overlap\": {},\n  \"refine\": {{{}}}\n}}\n",
        trace.meta("model").unwrap_or(""),
        trace.meta("sparsity").unwrap_or(""),
        fmt_vec(&share[0]),
        fmt_vec(&share[1]),
        fmt_vec(&share[2]),
        per_s(&active),
        per_s(&overlap),
        refine.join(", ")
    ))
}
