//! `leanstream train-eviction`: the `learned` cache policy's reuse-distance table
//! (`leanstream::predict::reuse`, paper 3.3.3) trained on the access stream of a trace's
//! active sets, with the same stacked hashing net and training as the neuron predictor.
//!
//! Samples: every access of the stream, its features as the cache computes them (the gaps
//! between the block's last accesses, its count) and its target, the ticks until the block's
//! next access; accesses with no next access in the trace are left out (their distance is not
//! known). Targets are quantized in equal-probability bins of log distance (outliers clipped
//! at the 1st and 99th percentiles); the net learns the bits of the bin's index (BCE), and the
//! table keeps each bin's median distance.
//!
//! Two streams, as the two caches see them: `per-layer` (one cache per layer, as
//! `leanstream cache-sim` models it; ticks count one layer's accesses) and `runtime` (one cache
//! for all layers, each token's layers in order, as the streaming engine requests them).

use super::placement::ActiveSets;
use super::train::net::Shape;
use super::train::rng::Rng;
use super::train::{export, fit, TrainOptions};
use leanstream::predict::reuse::{features, ReuseTable, FEATURES, HISTORY, MAX_CODE_BITS, NEVER};
use leanstream::stream::BlockId;

/// Which access stream the table learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessStream {
    PerLayer,
    Runtime,
}

impl AccessStream {
    pub fn parse(s: &str) -> Result<AccessStream, String> {
        match s {
            "per-layer" => Ok(AccessStream::PerLayer),
            "runtime" => Ok(AccessStream::Runtime),
            _ => Err(format!(
                "unknown --stream '{s}': expected per-layer or runtime"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AccessStream::PerLayer => "per-layer",
            AccessStream::Runtime => "runtime",
        }
    }

    /// The stream's sequences: one per layer, or one for all (global block ids).
    pub fn sequences(self, active: &ActiveSets) -> Vec<Vec<Vec<BlockId>>> {
        match self {
            AccessStream::PerLayer => active.sets.clone(),
            AccessStream::Runtime => {
                let n = active.neurons as u32;
                let steps = (0..active.tokens())
                    .flat_map(|t| {
                        active.sets.iter().enumerate().map(move |(l, s)| {
                            s[t].iter().map(|&j| l as u32 * n + j).collect::<Vec<_>>()
                        })
                    })
                    .collect();
                vec![steps]
            }
        }
    }
}

/// Features and targets of every access of `seqs` with a known next access.
pub fn samples(seqs: &[Vec<Vec<BlockId>>]) -> (Vec<f32>, Vec<u32>) {
    let (mut x, mut d) = (Vec::new(), Vec::new());
    let mut f = [0f32; FEATURES];
    for seq in seqs {
        let flat: Vec<BlockId> = seq.iter().flatten().copied().collect();
        let blocks = flat.iter().map(|&b| b as usize + 1).max().unwrap_or(0);
        let mut next = vec![usize::MAX; flat.len()];
        let mut seen = vec![usize::MAX; blocks];
        for i in (0..flat.len()).rev() {
            next[i] = seen[flat[i] as usize];
            seen[flat[i] as usize] = i;
        }
        // As `stream::policy` keeps them: the tick is the access's number from 1.
        let mut last = vec![u64::MAX; blocks];
        let mut gaps = vec![[NEVER; HISTORY]; blocks];
        let mut count = vec![0u32; blocks];
        for (i, &b) in flat.iter().enumerate() {
            let (b, tick) = (b as usize, i as u64 + 1);
            count[b] += 1;
            let gap = match last[b] {
                u64::MAX => NEVER,
                l => (tick - l).min(NEVER as u64) as u32,
            };
            gaps[b].copy_within(0..HISTORY - 1, 1);
            gaps[b][0] = gap;
            last[b] = tick;
            if next[i] != usize::MAX {
                features(&gaps[b], count[b], &mut f);
                x.extend_from_slice(&f);
                d.push(((next[i] - i) as u64).min(NEVER as u64) as u32);
            }
        }
    }
    (x, d)
}

/// Equal-probability bins of log distance: each sample's bin and each bin's median distance.
pub fn bins(d: &[u32], code_bits: usize) -> (Vec<usize>, Vec<u32>) {
    let nb = 1usize << code_bits;
    let mut sorted = d.to_vec();
    sorted.sort_unstable();
    let q =
        |p: f64| sorted[((p * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)];
    let (lo, hi) = (q(0.01), q(0.99));
    let clipped: Vec<u32> = sorted.iter().map(|&v| v.clamp(lo, hi)).collect();
    // Edges: the k/nb quantiles; bin k holds values in [edge k, edge k+1).
    let edges: Vec<u32> = (1..nb)
        .map(|k| clipped[k * (clipped.len() - 1) / nb])
        .collect();
    let bin_of = |v: u32| edges.partition_point(|&e| e <= v.clamp(lo, hi));
    let which: Vec<usize> = d.iter().map(|&v| bin_of(v)).collect();
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); nb];
    for (&v, &k) in d.iter().zip(&which) {
        members[k].push(v);
    }
    // An empty bin (ties at an edge) takes its neighbour's value below, or above for bin 0.
    let mut distance = vec![0u32; nb];
    for k in 0..nb {
        let m = &mut members[k];
        m.sort_unstable();
        distance[k] = if m.is_empty() {
            if k > 0 {
                distance[k - 1]
            } else {
                0
            }
        } else {
            m[m.len() / 2]
        };
    }
    if members[0].is_empty() {
        let first = (0..nb).find(|&k| !members[k].is_empty()).unwrap_or(0);
        for k in 0..first {
            distance[k] = distance[first];
        }
    }
    (which, distance)
}

#[derive(Clone, Debug)]
pub struct EvictOptions {
    pub stream: AccessStream,
    pub code_bits: usize,
    /// Most samples trained on (drawn at random when there are more).
    pub max_samples: usize,
    pub train: TrainOptions,
}

/// Trains the table on `active`'s access stream; returns it with the training's first and last
/// mean loss and the share of samples whose predicted bin is right.
pub fn train_eviction(
    active: &ActiveSets,
    model_name: &str,
    o: &EvictOptions,
) -> Result<(ReuseTable, f32, f32, f64), String> {
    if !(1..=MAX_CODE_BITS).contains(&o.code_bits) {
        return Err(format!("--code-bits {}: 1 to {MAX_CODE_BITS}", o.code_bits));
    }
    let seqs = o.stream.sequences(active);
    let (mut x, mut d) = samples(&seqs);
    if d.is_empty() {
        return Err("no access in the trace is used twice: nothing to learn".into());
    }
    let mut rng = Rng::new(o.train.seed);
    if d.len() > o.max_samples {
        let mut idx: Vec<usize> = (0..d.len()).collect();
        rng.shuffle(&mut idx);
        idx.truncate(o.max_samples);
        idx.sort_unstable();
        x = idx
            .iter()
            .flat_map(|&i| x[i * FEATURES..][..FEATURES].to_vec())
            .collect();
        d = idx.iter().map(|&i| d[i]).collect();
    }
    let (which, distance) = bins(&d, o.code_bits);
    let mut y = vec![0f32; d.len() * o.code_bits];
    for (s, &k) in which.iter().enumerate() {
        for bit in 0..o.code_bits {
            y[s * o.code_bits + bit] = (k >> bit & 1) as f32;
        }
    }
    let t = &o.train;
    let shape = Shape {
        dim: FEATURES,
        pca: FEATURES,
        heads: t.heads,
        tau: t.tau,
        depth: t.depth,
        out_heads: t.out_heads,
        out_tau: t.out_tau,
        neurons: o.code_bits,
    };
    let (net, first, last) =
        fit(shape, &x, &y, t, &mut rng).map_err(|e| format!("training: {e}"))?;
    let table = ReuseTable {
        model: model_name.to_string(),
        trained_on: format!(
            "{} stream, {} tokens, {} samples",
            o.stream.name(),
            active.tokens(),
            d.len()
        ),
        depth: t.depth as u8,
        heads: t.heads as u8,
        tau: t.tau as u8,
        out_heads: t.out_heads as u8,
        out_tau: t.out_tau as u8,
        code_bits: o.code_bits as u8,
        net: export::export(&net, o.code_bits as u32).map_err(|e| format!("training: {e}"))?,
        distance,
        seed: t.seed,
    };
    table.validate()?;
    // How often the exported table's integer inference picks the right bin.
    let right = which
        .iter()
        .enumerate()
        .filter(|&(s, &k)| {
            let f: &[f32; FEATURES] = x[s * FEATURES..][..FEATURES].try_into().unwrap();
            table.bin_of(f) == k
        })
        .count();
    Ok((table, first, last, right as f64 / which.len() as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_the_caches_features_and_the_ticks_to_the_next_use() {
        // Block 7 at ticks 1, 3 and 6; block 9 at 2 and 4; block 5 once.
        let seq = vec![vec![vec![7, 9], vec![7, 9], vec![5, 7]]];
        let (x, d) = samples(&seq);
        // Accesses with a next use: 7@1 (->3), 9@2 (->4), 7@3 (->6).
        assert_eq!(d, vec![2, 2, 3]);
        assert_eq!(x.len(), 3 * FEATURES);
        let mut f = [0f32; FEATURES];
        features(&[2, NEVER, NEVER, NEVER], 2, &mut f);
        assert_eq!(
            &x[2 * FEATURES..],
            &f[..],
            "7@3: one gap of 2 ticks, count 2"
        );
    }

    #[test]
    fn bins_hold_equal_shares_and_their_medians() {
        let d: Vec<u32> = (1..=1000).collect();
        let (which, distance) = bins(&d, 2);
        for k in 0..4 {
            let n = which.iter().filter(|&&b| b == k).count();
            assert!((240..=260).contains(&n), "bin {k} holds {n}");
        }
        assert!(distance.windows(2).all(|w| w[0] < w[1]), "{distance:?}");
        assert_eq!(which[0], 0);
        assert_eq!(which[999], 3);
    }
}
