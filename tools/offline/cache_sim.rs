//! Miss ratios of the weight cache's policies on recorded activations (`leanstream cache-sim`):
//! a per-neuron cache per layer, fed each token's active set in order, for `lru`, `lfu`, `hot`
//! (PowerInfer-2: the most frequently active neurons of a profiling run pinned, the rest LFU)
//! and Belady's optimal eviction beside them as the floor (`leanstream::stream::sim`), and
//! with a reuse-distance table the `learned` policy (paper 3.3.3).

use super::placement::ActiveSets;
use leanstream::predict::reuse::ReuseTable;
use leanstream::stream::sim::{belady, simulate, simulate_learned, SimResult};
use leanstream::stream::Policy;
use std::sync::Arc;

/// The share of the cache the `hot` policy pins (the rest is LFU).
pub const HOT_SHARE: f64 = 0.5;

/// One budget's miss ratios: `lru`, `lfu`, `hot`, then Belady's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MissRatios {
    pub budget: f64,
    pub policies: [f64; 3],
    /// With a reuse-distance table: the `learned` policy's.
    pub learned: Option<f64>,
    pub belady: f64,
}

/// The miss ratios at each budget (a fraction of each layer's neurons), summed over layers;
/// `profile` gives the hot policy its neuron frequencies (another text, or the same).
pub fn miss_ratios(
    active: &ActiveSets,
    profile: &ActiveSets,
    budgets: &[f64],
    learned: Option<&Arc<ReuseTable>>,
) -> Result<Vec<MissRatios>, String> {
    let n = active.neurons;
    let mut out = Vec::new();
    for &budget in budgets {
        if !(budget > 0.0 && budget <= 1.0) {
            return Err(format!(
                "a cache budget is a fraction in (0, 1], not {budget}"
            ));
        }
        let capacity = ((budget * n as f64).round() as usize).clamp(2, n);
        let mut sums = [SimResult::default(); 5];
        for (l, sets) in active.sets.iter().enumerate() {
            let mut freq = vec![0u32; n];
            for set in &profile.sets[l] {
                for &j in set {
                    freq[j as usize] += 1;
                }
            }
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by_key(|&j| std::cmp::Reverse(freq[j as usize]));
            let pinned = ((capacity as f64 * HOT_SHARE) as usize).min(capacity - 1);
            let hot = &order[..pinned];
            for (i, p) in Policy::ALL.iter().enumerate() {
                let r = simulate(*p, capacity, hot, sets).map_err(|e| e.to_string())?;
                sums[i].accesses += r.accesses;
                sums[i].misses += r.misses;
            }
            let b = belady(capacity, sets);
            sums[3].accesses += b.accesses;
            sums[3].misses += b.misses;
            if let Some(t) = learned {
                let r = simulate_learned(t.clone(), capacity, sets).map_err(|e| e.to_string())?;
                sums[4].accesses += r.accesses;
                sums[4].misses += r.misses;
            }
        }
        out.push(MissRatios {
            budget,
            policies: [
                sums[0].miss_ratio(),
                sums[1].miss_ratio(),
                sums[2].miss_ratio(),
            ],
            learned: learned.map(|_| sums[4].miss_ratio()),
            belady: sums[3].miss_ratio(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leanstream::engine::sample::Rng;

    fn sets(n: usize, tokens: usize, keep: usize, seed: u64) -> ActiveSets {
        let mut rng = Rng::new(seed);
        let layer = |rng: &mut Rng| -> Vec<Vec<u32>> {
            (0..tokens)
                .map(|_| {
                    // Skewed: low neurons far more often, as real activations are.
                    let mut s: Vec<u32> = (0..keep)
                        .map(|_| {
                            let r = rng.next_f32();
                            ((r * r * r) * n as f32) as u32
                        })
                        .collect();
                    s.sort_unstable();
                    s.dedup();
                    s
                })
                .collect()
        };
        ActiveSets {
            neurons: n,
            sets: vec![layer(&mut rng), layer(&mut rng)],
        }
    }

    #[test]
    fn belady_is_the_floor_and_a_whole_cache_misses_only_once_per_neuron() {
        let a = sets(200, 300, 40, 1);
        let r = miss_ratios(&a, &a, &[0.1, 0.25, 0.5, 1.0], None).unwrap();
        for m in &r {
            for p in m.policies {
                assert!(m.belady <= p + 1e-12, "{m:?}");
            }
        }
        // Bigger caches miss less, for the floor at least.
        assert!(r.windows(2).all(|w| w[1].belady <= w[0].belady), "{r:?}");
        // The whole layer fits: only first uses miss, for every policy.
        let distinct: usize = a
            .sets
            .iter()
            .map(|l| {
                let mut all: Vec<u32> = l.iter().flatten().copied().collect();
                all.sort_unstable();
                all.dedup();
                all.len()
            })
            .sum();
        let accesses: usize = a.sets.iter().flatten().map(Vec::len).sum();
        let cold = distinct as f64 / accesses as f64;
        let whole = r[3];
        assert!((whole.belady - cold).abs() < 1e-12 && (whole.policies[0] - cold).abs() < 1e-12);
        assert!(miss_ratios(&a, &a, &[0.0], None).is_err());
    }
}
