//! `leanstream train-eviction`: the `learned` cache policy's reuse-distance table
//! (`leanstream::predict::reuse`, paper 3.3.3) trained on the access stream of a trace's
//! active sets, with the same stacked hashing net and training as the neuron predictor.
//!
//! Time is in tokens (see `predict::reuse`). Samples: block states drawn at random from the
//! stream ([`samples`]), their features as the cache computes them (the shared
//! [`History`]) and their target, the tokens until the block's next use. Targets are quantized
//! in equal-probability bins; the net learns the bits of the bin's index (BCE), and the table
//! keeps each bin's mean distance.
//!
//! Two streams, as the two caches see them: `per-layer` (one cache per layer, as
//! `leanstream cache-sim` models it) and `runtime` (one cache
//! for all layers, each token's layers in order, as the streaming engine requests them).

use super::placement::ActiveSets;
use super::train::net::Shape;
use super::train::rng::Rng;
use super::train::{export, fit, TrainOptions};
use leanstream::predict::reuse::{History, ReuseTable, BITS, FEATURES, HORIZON, MAX_CODE_BITS};
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

/// Tokens a stream runs before its states are sampled (the frequencies settle).
pub const WARMUP: u32 = 8;

/// Samples of `seqs`' access streams, at most about `max` of them drawn at random: at the
/// start of each token (as [`History`] counts them, the clock the cache runs) and for each
/// block used in the last `BITS` tokens (the blocks a cache holds; a block long gone would
/// fill the bins with far distances that the eviction order hardly needs), its features then and its target, the tokens until its next use
/// (capped at `HORIZON`; left out when the trace ends sooner). These are the states the
/// `learned` policy predicts from: at an access, and for every evictable block when a token
/// begins (a block used in the current token is predicted as of the next one, the state the
/// next token's start samples).
pub fn samples(seqs: &[Vec<Vec<BlockId>>], max: usize, rng: &mut Rng) -> (Vec<f32>, Vec<u32>) {
    // First pass: each access's token, and how many states there are to draw from.
    let mut runs = Vec::new();
    let mut states = 0u64;
    for seq in seqs {
        let flat: Vec<BlockId> = seq.iter().flatten().copied().collect();
        let blocks = flat.iter().map(|&b| b as usize + 1).max().unwrap_or(0);
        let mut h = History::new(blocks);
        // Per block: the token of its last use (recent while within BITS tokens).
        let mut recent = vec![0u32; blocks];
        let mut token = Vec::with_capacity(flat.len());
        for &b in &flat {
            let b = b as usize;
            if h.begin(b) && h.now() >= WARMUP {
                states += recent
                    .iter()
                    .filter(|&&r| r + BITS as u32 >= h.now())
                    .count() as u64;
            }
            recent[b] = h.now();
            h.record(b);
            token.push(h.now());
        }
        runs.push((flat, blocks, token, h.now() + 1));
    }
    let p = (max as f64 / states.max(1) as f64).min(1.0);
    let (mut x, mut d) = (Vec::new(), Vec::new());
    let mut f = [0f32; FEATURES];
    for (flat, blocks, token, tokens) in runs {
        // Per block, the tokens of its uses in order.
        let mut uses: Vec<Vec<u32>> = vec![Vec::new(); blocks];
        for (&b, &t) in flat.iter().zip(&token) {
            uses[b as usize].push(t);
        }
        let mut h = History::new(blocks);
        for &b in &flat {
            let b = b as usize;
            if h.begin(b) && h.now() >= WARMUP {
                let now = h.now();
                for (c, u) in uses.iter().enumerate() {
                    let used = h.count(c) as usize;
                    if !h.recent(c) || rng.uniform() >= p {
                        continue;
                    }
                    let base = h.features(c, &mut f);
                    let dist = match u.get(used) {
                        Some(&next) => (next - base).min(HORIZON),
                        None if tokens - base > HORIZON => HORIZON,
                        None => continue,
                    };
                    debug_assert_eq!(base, now);
                    x.extend_from_slice(&f);
                    d.push(dist);
                }
            }
            h.record(b);
        }
    }
    (x, d)
}

/// Equal-probability bins of distance: each sample's bin and each bin's mean distance.
pub fn bins(d: &[u32], code_bits: usize) -> (Vec<usize>, Vec<f32>) {
    let nb = 1usize << code_bits;
    let mut sorted = d.to_vec();
    sorted.sort_unstable();
    // Edges: the k/nb quantiles; bin k holds values in (edge k-1, edge k], so a value many
    // samples share (0: back next token) fills its bin alone, leaving the next ones empty.
    let edges: Vec<u32> = (1..nb)
        .map(|k| sorted[k * (sorted.len() - 1) / nb])
        .collect();
    let which: Vec<usize> = d
        .iter()
        .map(|&v| edges.partition_point(|&e| e < v))
        .collect();
    let mut sum = vec![(0f64, 0usize); nb];
    for (&v, &k) in d.iter().zip(&which) {
        sum[k].0 += v as f64;
        sum[k].1 += 1;
    }
    // An empty bin takes its neighbour's value below, or above for the first bins.
    let mut distance = vec![f32::NAN; nb];
    for k in 0..nb {
        distance[k] = match sum[k] {
            (_, 0) if k > 0 => distance[k - 1],
            (_, 0) => f32::NAN,
            (s, n) => (s / n as f64) as f32,
        };
    }
    let first = distance
        .iter()
        .copied()
        .find(|v| !v.is_nan())
        .unwrap_or(0.0);
    for v in distance.iter_mut().take_while(|v| v.is_nan()) {
        *v = first;
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
    let mut rng = Rng::new(o.train.seed);
    let (x, d) = samples(&seqs, o.max_samples, &mut rng);
    if d.is_empty() {
        return Err(format!(
            "no block state to learn from: the trace needs more than {WARMUP} tokens"
        ));
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
    fn samples_are_the_caches_features_and_the_tokens_to_the_next_use() {
        // Block 7 in every token, block 9 in tokens 0 and 3, block 5 in token 1 only.
        let mut seq: Vec<Vec<BlockId>> = vec![vec![7, 9], vec![5, 7], vec![7], vec![7, 9]];
        seq.extend((0..100).map(|_| vec![7]));
        let (x, d) = samples(&[seq.clone()], usize::MAX, &mut Rng::new(1));
        // From token 8 on (WARMUP), each token's start samples the blocks used in the 8 tokens
        // before: 7 (back now: 0) in all 96; 9 (last used in token 3, never back: the
        // horizon) in tokens 8 to 11; 5 in token 8 only, as the clock counts it in token 0 (a
        // token begins at its first block used in the one before: 7, after 5).
        let mut got = d.clone();
        got.sort_unstable();
        let mut want = vec![0; 96];
        want.extend([HORIZON; 5]);
        assert_eq!(got, want);
        // The first sample is block 5 at the start of token 8, as the cache's history says.
        let mut h = History::new(10);
        for &b in seq.iter().take(8).flatten() {
            h.access(b as usize);
        }
        assert!(h.begin(7));
        let mut f = [0f32; FEATURES];
        assert_eq!(h.features(5, &mut f), 8);
        assert_eq!(&x[..FEATURES], &f[..]);
        assert_eq!(d[0], HORIZON);
        assert_eq!(d[1], 0, "block 7 is back in token 8");
        // At most about `max` samples are drawn.
        let (_, few) = samples(&[seq], 50, &mut Rng::new(1));
        assert!((25..=80).contains(&few.len()), "{}", few.len());
    }

    #[test]
    fn bins_hold_equal_shares_and_their_means() {
        let d: Vec<u32> = (1..=1000).collect();
        let (which, distance) = bins(&d, 2);
        for k in 0..4 {
            let n = which.iter().filter(|&&b| b == k).count();
            assert!((240..=260).contains(&n), "bin {k} holds {n}");
        }
        assert!(distance.windows(2).all(|w| w[0] < w[1]), "{distance:?}");
        assert!((distance[0] - 125.0).abs() < 2.0, "{distance:?}");
        assert_eq!(which[0], 0);
        assert_eq!(which[999], 3);
        // Ties: half the samples at 0 leave bin 1 empty; it takes bin 0's value.
        let d: Vec<u32> = (0..100).map(|i| if i < 50 { 0 } else { i }).collect();
        let (which, distance) = bins(&d, 2);
        assert_eq!(which.iter().filter(|&&b| b == 0).count(), 50);
        assert_eq!(distance[0], 0.0);
        assert_eq!(distance[1], 0.0);
        assert!(
            distance[2] > 0.0 && distance[3] > distance[2],
            "{distance:?}"
        );
    }

    /// A stream with structure in its history: blocks 0-3 are used every token, 4-11 every
    /// other token, 12-27 every fourth, and each token also uses 4 blocks never seen again.
    /// 16 blocks a token into 12 slots: LRU, going round in id order, misses nearly all; a
    /// table trained by the real trainer on the first 150 tokens tells the periods apart from
    /// the access bitmap and keeps the blocks back soonest on the next 150.
    #[test]
    fn a_trained_table_beats_lru_on_periodic_blocks() {
        use leanstream::stream::sim::{belady, simulate, simulate_learned};
        use leanstream::stream::Policy;
        let tokens = |from: u32, n: u32| -> Vec<Vec<BlockId>> {
            (from..from + n)
                .map(|t| {
                    let mut s: Vec<BlockId> = (0..4).collect();
                    s.extend((4..12).filter(|b| (t + b) % 2 == 0));
                    s.extend((12..28).filter(|b| (t + b) % 4 == 0));
                    s.extend((0..4).map(|i| 28 + 4 * t + i));
                    s
                })
                .collect()
        };
        let train = ActiveSets {
            neurons: 28 + 4 * 150,
            sets: vec![tokens(0, 150)],
        };
        let o = EvictOptions {
            stream: AccessStream::PerLayer,
            code_bits: 3,
            max_samples: 20_000,
            train: TrainOptions {
                depth: 3,
                heads: 2,
                tau: 8,
                out_heads: 4,
                out_tau: 8,
                pca: 1.0,
                epochs: 4,
                batch: 256,
                lr: 0.01,
                seed: 3,
                ..TrainOptions::default()
            },
        };
        let (table, _, _, right) = train_eviction(&train, "synthetic", &o).unwrap();
        let test = tokens(150, 150);
        let cap = 12;
        let learned = simulate_learned(std::sync::Arc::new(table), cap, &test).unwrap();
        let lru = simulate(Policy::Lru, cap, &[], &test).unwrap();
        let floor = belady(cap, &test);
        assert!(learned.misses >= floor.misses, "{learned:?} {floor:?}");
        assert!(
            (learned.misses as f64) < 0.8 * lru.misses as f64,
            "learned {learned:?} lru {lru:?} belady {floor:?} (right bin {right:.3})"
        );
    }
}
