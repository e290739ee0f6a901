//! `leanstream calibrate`: per-layer activation thresholds for target sparsities, from the
//! magnitudes a dense engine's tap records over calibration text, and the dropped neurons'
//! means under them (the table format is `leanstream::sparsity::thresholds`).

use leanstream::engine::Engine;
use leanstream::sparsity::thresholds::{DroppedMean, ThresholdLevel};
use leanstream::sparsity::Score;

/// Runs `tokens` through `engine` (booted dense with a tap) in windows of `ctx`, as
/// perplexity does, twice: first for the magnitude histograms of both scores for every layer,
/// which set each level's thresholds, then for the dropped-neuron means under them. Returns
/// the histograms and one level per entry of `sparsities`. `progress` gets the tokens done
/// over both passes (`2 * tokens.len()` in all).
pub fn calibrate(
    engine: &mut Engine,
    tokens: &[u32],
    ctx: usize,
    sparsities: &[f32],
    progress: &mut dyn FnMut(usize),
) -> Result<(Histograms, Vec<ThresholdLevel>), String> {
    if engine.tap().is_none() {
        return Err("calibration needs an engine booted dense with a tap".into());
    }
    if ctx == 0 || ctx > engine.context {
        return Err(format!(
            "window {ctx} does not fit the engine's context {}",
            engine.context
        ));
    }
    let (n_layers, hidden, dim) = (
        engine.hyper.n_layers,
        engine.hyper.hidden_dim,
        engine.hyper.dim,
    );
    let mut hist = Histograms::new(n_layers);
    for (i, &t) in tokens.iter().enumerate() {
        engine.forward(t, i % ctx);
        let tap = engine.tap().expect("checked above");
        for l in 0..n_layers {
            hist.add(l, Score::Glu, &tap.neuron_act[l * hidden..][..hidden]);
            hist.add(l, Score::Gate, &tap.gate_act[l * hidden..][..hidden]);
        }
        progress(i + 1);
    }
    let mut levels: Vec<ThresholdLevel> = sparsities.iter().map(|&s| hist.level(s)).collect();
    // Per level and score: the sum of each neuron's activation while dropped, and how often.
    let slots = levels.len() * 2;
    let mut sums = vec![0f64; slots * n_layers * hidden];
    let mut counts = vec![0u32; slots * n_layers * hidden];
    for (i, &t) in tokens.iter().enumerate() {
        engine.forward(t, i % ctx);
        let tap = engine.tap().expect("checked above");
        for l in 0..n_layers {
            let act = &tap.neuron_act[l * hidden..][..hidden];
            for (v, lv) in levels.iter().enumerate() {
                for (k, (score, th)) in [(&tap.neuron_act, lv.glu[l]), (&tap.gate_act, lv.gate[l])]
                    .into_iter()
                    .enumerate()
                {
                    let at = ((v * 2 + k) * n_layers + l) * hidden;
                    let score = &score[l * hidden..][..hidden];
                    for j in 0..hidden {
                        if score[j].abs() < th {
                            sums[at + j] += act[j] as f64;
                            counts[at + j] += 1;
                        }
                    }
                }
            }
        }
        progress(tokens.len() + i + 1);
    }
    for (v, lv) in levels.iter_mut().enumerate() {
        for k in 0..2 {
            let at = (v * 2 + k) * n_layers * hidden;
            let mean: Vec<f32> = sums[at..][..n_layers * hidden]
                .iter()
                .zip(&counts[at..][..n_layers * hidden])
                .map(|(&s, &c)| if c > 0 { (s / c as f64) as f32 } else { 0.0 })
                .collect();
            let mut offset = vec![0f32; n_layers * dim];
            for l in 0..n_layers {
                engine.ffn_down_exact(
                    l,
                    &mean[l * hidden..][..hidden],
                    &mut offset[l * dim..][..dim],
                )?;
            }
            let d = DroppedMean { mean, offset };
            if k == 0 {
                lv.glu_dropped = d;
            } else {
                lv.gate_dropped = d;
            }
        }
    }
    Ok((hist, levels))
}

const BINS: usize = 1 << 16;
const SHIFT: u32 = 15;

/// Magnitude histograms, one per layer and score.
pub struct Histograms {
    pub n_layers: usize,
    counts: Vec<u64>,
    totals: Vec<u64>,
}

impl Histograms {
    pub fn new(n_layers: usize) -> Histograms {
        Histograms {
            n_layers,
            counts: vec![0; n_layers * 2 * BINS],
            totals: vec![0; n_layers * 2],
        }
    }

    fn slot(&self, l: usize, score: Score) -> usize {
        assert!(l < self.n_layers);
        l * 2 + score as usize
    }

    /// Adds |v| for every value of one token's layer `l`.
    pub fn add(&mut self, l: usize, score: Score, values: &[f32]) {
        let s = self.slot(l, score);
        let bins = &mut self.counts[s * BINS..][..BINS];
        for v in values {
            let bits = v.abs().to_bits();
            bins[((bits >> SHIFT) as usize).min(BINS - 1)] += 1;
        }
        self.totals[s] += values.len() as u64;
    }

    /// The threshold under which a fraction `sparsity` of layer `l`'s values fall.
    pub fn threshold(&self, l: usize, score: Score, sparsity: f32) -> f32 {
        let s = self.slot(l, score);
        if sparsity <= 0.0 || self.totals[s] == 0 {
            return 0.0;
        }
        let bins = &self.counts[s * BINS..][..BINS];
        let target = sparsity as f64 * self.totals[s] as f64;
        let mut below = 0f64;
        for (b, &c) in bins.iter().enumerate() {
            if c > 0 && below + c as f64 > target {
                let lo = f32::from_bits((b as u32) << SHIFT) as f64;
                let hi = f32::from_bits(((b as u32) + 1) << SHIFT) as f64;
                return (lo + (hi - lo) * (target - below) / c as f64) as f32;
            }
            below += c as f64;
        }
        f32::MAX
    }

    /// The fraction of layer `l`'s values under `t` (exact at bin edges, interpolated inside).
    pub fn fraction_below(&self, l: usize, score: Score, t: f32) -> f64 {
        let s = self.slot(l, score);
        let bins = &self.counts[s * BINS..][..BINS];
        let tb = t.to_bits();
        let b = ((tb >> SHIFT) as usize).min(BINS - 1);
        let below: u64 = bins[..b].iter().sum();
        let lo = f32::from_bits((b as u32) << SHIFT) as f64;
        let hi = f32::from_bits(((b as u32) + 1) << SHIFT) as f64;
        let part = if hi > lo {
            (t as f64 - lo) / (hi - lo)
        } else {
            0.0
        };
        (below as f64 + part * bins[b] as f64) / self.totals[s].max(1) as f64
    }

    /// A table level for `sparsity`, its thresholds only (`calibrate` adds the dropped means).
    pub fn level(&self, sparsity: f32) -> ThresholdLevel {
        ThresholdLevel {
            sparsity,
            glu: (0..self.n_layers)
                .map(|l| self.threshold(l, Score::Glu, sparsity))
                .collect(),
            gate: (0..self.n_layers)
                .map(|l| self.threshold(l, Score::Gate, sparsity))
                .collect(),
            glu_dropped: DroppedMean::default(),
            gate_dropped: DroppedMean::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_split_the_values_at_the_asked_fraction() {
        let mut h = Histograms::new(2);
        // Layer 0: 0.001, 0.002, ..., 10.0 (10,000 values spread over many octaves).
        let vals: Vec<f32> = (1..=10_000).map(|i| i as f32 * 0.001).collect();
        h.add(0, Score::Glu, &vals);
        h.add(1, Score::Gate, &[-1.0, 2.0, -3.0, 4.0]);
        for s in [0.3f32, 0.5, 0.8, 0.9] {
            let t = h.threshold(0, Score::Glu, s);
            let below = vals.iter().filter(|&&v| v < t).count() as f32 / vals.len() as f32;
            assert!(
                (below - s).abs() < 0.002,
                "s {s}: threshold {t} leaves {below} below"
            );
            assert!((h.fraction_below(0, Score::Glu, t) - s as f64).abs() < 1e-3);
        }
        assert_eq!(h.threshold(0, Score::Glu, 0.0), 0.0);
        // Signs are dropped: half of |-1, 2, -3, 4| lies under a threshold between 2 and 3.
        let t = h.threshold(1, Score::Gate, 0.5);
        assert!((2.0..=3.0).contains(&t), "{t}");
        // An empty histogram keeps everything.
        assert_eq!(h.threshold(1, Score::Glu, 0.5), 0.0);
        let level = h.level(0.5);
        assert_eq!((level.glu.len(), level.gate.len()), (2, 2));
    }
}
