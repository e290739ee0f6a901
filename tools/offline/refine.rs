//! Speculate-and-refine, measured (LeanStream paper 2.1, eq. 1-2, 4.3.6 and its figure 12):
//! layer n+1's neurons predicted from the partial residual after each of the K stages of layer
//! n's FFN, `r_k = x_n + sum of stages 1..=k` (r_0 = x_n, the one-shot prediction; r_K the
//! whole FFN's output), with the stages taken in priority order (descending |activation|) or in
//! neuron index order (the "arbitrary" order), as a trace records them
//! (`stage_residual_priority`, `stage_residual_index`).
//!
//! A predictor here is anything that scores layer n+1's neurons from a residual (a table
//! trained on `PredictorInput::PrevFfnOutput`, whose complete input is r_K). Per stage k:
//! - `top10`: of the oracle's top 10% of layer n+1 (largest |SiLU(gate) * up|), the share among
//!   the predictor's top 10%;
//! - `importance`: the oracle set's |activation| captured by the predictor's read set (its
//!   `read` top scores), over the oracle set's total (the paper's importance ratio).
//!
//! Averaged over tokens and over layers 1..L (layer 0 has no layer before it).

use super::oracle;
use super::trace::TraceReader;

/// Stage k's figures, priority order then index order.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageFigures {
    pub top10: [f64; 2],
    pub importance: [f64; 2],
}

/// The residual after layer `l`'s FFN stages 1..=k (k = 0: x_l) of token `t`, in `order` (0:
/// priority, 1: index).
fn stage_input<'a>(
    trace: &TraceReader,
    tensors: &(&'a [f32], &'a [f32], &'a [f32]),
    t: usize,
    l: usize,
    k: usize,
    order: usize,
) -> &'a [f32] {
    let (res, pri, idx) = *tensors;
    let (nl, dim, ks) = (trace.layers, trace.dim, trace.stages);
    if k == 0 {
        return &res[(t * nl + l) * dim..][..dim];
    }
    let src = if order == 0 { pri } else { idx };
    &src[((t * nl + l) * ks + k - 1) * dim..][..dim]
}

/// Scores layer `l`'s neurons from a residual: `score(l, input, scores)`.
pub type Scorer<'a> = dyn FnMut(usize, &[f32], &mut [f32]) + 'a;

/// Figures per stage 0..=K. `score(l, input, scores)` scores layer `l`'s neurons from a
/// residual; `read(l)` is how many it reads; `thresholds` give each layer's oracle set.
pub fn refine(
    trace: &TraceReader,
    thresholds: &[f32],
    score: &mut Scorer,
    read: &dyn Fn(usize) -> usize,
) -> Result<Vec<StageFigures>, String> {
    let (tn, nl, n, ks) = (trace.tokens, trace.layers, trace.hidden, trace.stages);
    if thresholds.len() != nl {
        return Err(format!("{} thresholds for {nl} layers", thresholds.len()));
    }
    if nl < 2 || tn == 0 || ks == 0 {
        return Err("a trace of at least two layers, one token and one stage".into());
    }
    let tensors = (
        trace.tensor("ffn_residual")?,
        trace.tensor("stage_residual_priority")?,
        trace.tensor("stage_residual_index")?,
    );
    let acts = trace.tensor("neuron_act")?;
    let ten = (n / 10).max(1);
    let mut out = vec![StageFigures::default(); ks + 1];
    let (mut scores, mut order) = (vec![0f32; n], Vec::with_capacity(n));
    let (mut top_true, mut top_guess, mut set) = (Vec::new(), Vec::new(), Vec::new());
    let mut in_guess = vec![false; n];
    let count = (tn * (nl - 1)) as f64;
    for t in 0..tn {
        for l in 1..nl {
            let a = &acts[(t * nl + l) * n..][..n];
            oracle::top_magnitude(a, ten, &mut order, &mut top_true);
            oracle::oracle_set(a, thresholds[l], &mut set);
            let total: f64 = set.iter().map(|&j| a[j as usize].abs() as f64).sum();
            for (k, f) in out.iter_mut().enumerate() {
                for o in 0..2 {
                    score(l, stage_input(trace, &tensors, t, l - 1, k, o), &mut scores);
                    // The guessed top 10%, then the read set, by descending score.
                    top_scored(&scores, ten, &mut order, &mut top_guess);
                    for &j in &top_guess {
                        in_guess[j as usize] = true;
                    }
                    let hits = top_true.iter().filter(|&&j| in_guess[j as usize]).count();
                    for &j in &top_guess {
                        in_guess[j as usize] = false;
                    }
                    top_scored(&scores, read(l), &mut order, &mut top_guess);
                    for &j in &top_guess {
                        in_guess[j as usize] = true;
                    }
                    let got: f64 = set
                        .iter()
                        .filter(|&&j| in_guess[j as usize])
                        .map(|&j| a[j as usize].abs() as f64)
                        .sum();
                    for &j in &top_guess {
                        in_guess[j as usize] = false;
                    }
                    f.top10[o] += hits as f64 / ten as f64 / count;
                    f.importance[o] += if total > 0.0 { got / total } else { 1.0 } / count;
                }
            }
        }
    }
    Ok(out)
}

/// The `k` highest scores' indices (ties to the lower index): the read set a predictor gives.
fn top_scored(scores: &[f32], k: usize, order: &mut Vec<u32>, out: &mut Vec<u32>) {
    order.clear();
    order.extend(0..scores.len() as u32);
    order.sort_unstable_by(|&a, &b| {
        scores[b as usize]
            .total_cmp(&scores[a as usize])
            .then(a.cmp(&b))
    });
    out.clear();
    out.extend_from_slice(&order[..k.min(scores.len())]);
}
