//! The oracle's neuron set, as every offline statistic and predictor counts it: a layer's
//! neurons whose |SiLU(gate) * up| is at or over the layer's calibrated glu threshold at a
//! sparsity (`ThresholdTable`). `trace_stats`, the predictors' training and their report share
//! this definition.

use leanstream::sparsity::thresholds::ThresholdTable;
use leanstream::sparsity::Score;

/// Each layer's threshold at `sparsity`.
pub fn thresholds(table: &ThresholdTable, sparsity: f32) -> Result<Vec<f32>, String> {
    table
        .thresholds(sparsity, Score::Glu)
        .map_err(|e| e.to_string())
}

/// Whether a neuron of activation `act` is in the oracle set of a layer of threshold `thr`.
#[inline]
pub fn active(act: f32, thr: f32) -> bool {
    act.abs() >= thr
}

/// The oracle set of one layer and token: the indices of `acts` (ascending) that are active.
pub fn oracle_set(acts: &[f32], thr: f32, out: &mut Vec<u32>) {
    out.clear();
    out.extend(
        acts.iter()
            .enumerate()
            .filter(|(_, &a)| active(a, thr))
            .map(|(j, _)| j as u32),
    );
}

/// The `k` neurons of largest |activation| (ties to the lower index), ascending: the oracle's
/// top slice (the report's "top 10%").
pub fn top_magnitude(acts: &[f32], k: usize, order: &mut Vec<u32>, out: &mut Vec<u32>) {
    order.clear();
    order.extend(0..acts.len() as u32);
    order.sort_unstable_by(|&a, &b| {
        acts[b as usize]
            .abs()
            .total_cmp(&acts[a as usize].abs())
            .then(a.cmp(&b))
    });
    out.clear();
    out.extend_from_slice(&order[..k.min(acts.len())]);
    out.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_holds_what_reaches_the_threshold_in_magnitude() {
        let mut s = Vec::new();
        oracle_set(&[0.5, -2.0, 1.0, -0.99, 0.0], 1.0, &mut s);
        assert_eq!(s, vec![1, 2]);
        let (mut o, mut t) = (Vec::new(), Vec::new());
        top_magnitude(&[0.5, -2.0, 1.0, -1.0, 0.0], 2, &mut o, &mut t);
        assert_eq!(t, vec![1, 2], "ties go to the lower index");
    }
}
