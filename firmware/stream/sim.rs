//! Miss ratios without the disk: the cache's own replacement code ([`Replacement`]) run over a
//! recorded sequence of per-token block sets, and Belady's optimal eviction (evict the block
//! used farthest in the future) on the same sequence as the floor no policy can beat.
//!
//! The model: tokens in order, each token's blocks in the order given; every access to a block
//! not resident is a miss and brings it in (demand fetching, no bypass), evicting when full.
//! The cache starts empty, and with `hot`, the hot blocks are pinned once first loaded (their
//! first load is a miss like any other), so every policy pays the same cold misses Belady does.

use super::policy::{Policy, Replacement};
use super::{BlockId, StreamError};
use crate::predict::reuse::ReuseTable;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// Accesses and misses over a sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimResult {
    pub accesses: u64,
    pub misses: u64,
}

impl SimResult {
    pub fn miss_ratio(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.misses as f64 / self.accesses as f64
        }
    }
}

fn blocks_of(tokens: &[Vec<BlockId>]) -> usize {
    tokens
        .iter()
        .flatten()
        .map(|&b| b as usize + 1)
        .max()
        .unwrap_or(0)
}

/// `policy` with `capacity` slots over `tokens` (`hot`: the pinned blocks of [`Policy::Hot`]).
pub fn simulate(
    policy: Policy,
    capacity: usize,
    hot: &[BlockId],
    tokens: &[Vec<BlockId>],
) -> Result<SimResult, StreamError> {
    if capacity == 0 {
        return Err(StreamError::Config(
            "a simulated cache needs at least one slot",
        ));
    }
    if policy == Policy::Hot && hot.len() >= capacity {
        return Err(StreamError::TooManyHot {
            hot: hot.len(),
            slots: capacity,
        });
    }
    let blocks = blocks_of(tokens).max(hot.iter().map(|&b| b as usize + 1).max().unwrap_or(0));
    let mut r = Replacement::new(policy, capacity, blocks);
    if policy == Policy::Hot {
        for &b in hot {
            r.pin(b);
        }
    }
    Ok(run(r, tokens))
}

/// The `learned` policy with `table` and `capacity` slots over `tokens`.
pub fn simulate_learned(
    table: Arc<ReuseTable>,
    capacity: usize,
    tokens: &[Vec<BlockId>],
) -> Result<SimResult, StreamError> {
    if capacity == 0 {
        return Err(StreamError::Config(
            "a simulated cache needs at least one slot",
        ));
    }
    Ok(run(
        Replacement::learned(capacity, blocks_of(tokens), table),
        tokens,
    ))
}

fn run(mut r: Replacement, tokens: &[Vec<BlockId>]) -> SimResult {
    let mut res = SimResult::default();
    for &b in tokens.iter().flatten() {
        res.accesses += 1;
        if r.access(b).is_none() {
            res.misses += 1;
            r.insert(b)
                .expect("an evictable slot: fewer hot blocks than slots");
        }
    }
    res
}

/// Belady's MIN with `capacity` slots over `tokens`: the fewest misses any demand-fetching
/// cache of that size can have on this sequence.
pub fn belady(capacity: usize, tokens: &[Vec<BlockId>]) -> SimResult {
    belady_from(capacity, tokens, 0)
}

/// [`belady`] over all of `tokens`, counting accesses and misses only from step `from` on: the
/// floor for a measurement that starts with the cache warmed by the steps before.
pub fn belady_from(capacity: usize, tokens: &[Vec<BlockId>], from: usize) -> SimResult {
    let start: usize = tokens[..from.min(tokens.len())].iter().map(Vec::len).sum();
    let seq: Vec<BlockId> = tokens.iter().flatten().copied().collect();
    let blocks = blocks_of(tokens);
    // next[i]: the position of the next access to seq[i]'s block after i (usize::MAX: never).
    let mut next = vec![usize::MAX; seq.len()];
    let mut seen = vec![usize::MAX; blocks];
    for i in (0..seq.len()).rev() {
        next[i] = seen[seq[i] as usize];
        seen[seq[i] as usize] = i;
    }
    // Resident blocks with their next use; a max-heap of (next use, block), stale entries
    // skipped when they no longer match `next_use`.
    let mut resident = vec![false; blocks];
    let mut next_use = vec![usize::MAX; blocks];
    let mut heap: BinaryHeap<(usize, BlockId)> = BinaryHeap::new();
    let mut used = 0;
    let mut res = SimResult::default();
    for (i, &b) in seq.iter().enumerate() {
        let counted = (i >= start) as u64;
        res.accesses += counted;
        if !resident[b as usize] {
            res.misses += counted;
            if used == capacity {
                loop {
                    let (nu, v) = heap.pop().expect("a resident block");
                    if resident[v as usize] && next_use[v as usize] == nu {
                        resident[v as usize] = false;
                        break;
                    }
                }
            } else {
                used += 1;
            }
            resident[b as usize] = true;
        }
        next_use[b as usize] = next[i];
        heap.push((next[i], b));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The fewest misses over every choice of victim (demand fetching), by exhaustive search.
    fn brute_force(capacity: usize, seq: &[BlockId]) -> u64 {
        fn go(cap: usize, seq: &[BlockId], resident: &mut Vec<BlockId>) -> u64 {
            let Some((&b, rest)) = seq.split_first() else {
                return 0;
            };
            if resident.contains(&b) {
                return go(cap, rest, resident);
            }
            if resident.len() < cap {
                resident.push(b);
                let m = 1 + go(cap, rest, resident);
                resident.pop();
                return m;
            }
            let mut best = u64::MAX;
            for k in 0..resident.len() {
                let old = std::mem::replace(&mut resident[k], b);
                best = best.min(1 + go(cap, rest, resident));
                resident[k] = old;
            }
            best
        }
        go(capacity, seq, &mut Vec::new())
    }

    fn random_tokens(
        r: &mut impl FnMut() -> u64,
        n: usize,
        blocks: u64,
        per: usize,
    ) -> Vec<Vec<BlockId>> {
        (0..n)
            .map(|_| {
                let mut t: Vec<BlockId> = Vec::new();
                while t.len() < per {
                    // Skewed: low ids are hot, as neurons are.
                    let a = r() % blocks;
                    let b = (r() % blocks).min(a);
                    if !t.contains(&(b as BlockId)) {
                        t.push(b as BlockId);
                    }
                }
                t
            })
            .collect()
    }

    #[test]
    fn belady_equals_brute_force_on_tiny_sequences() {
        let mut r = rng(7);
        for case in 0..300 {
            let len = 3 + (r() % 9) as usize;
            let blocks = 2 + r() % 4;
            let cap = 1 + (r() % 3) as usize;
            let seq: Vec<BlockId> = (0..len).map(|_| (r() % blocks) as BlockId).collect();
            let tokens = vec![seq.clone()];
            assert_eq!(
                belady(cap, &tokens).misses,
                brute_force(cap, &seq),
                "case {case}: cap {cap} {seq:?}"
            );
        }
    }

    #[test]
    fn belady_is_a_floor_for_every_policy_on_random_sequences() {
        let mut r = rng(99);
        for case in 0..40 {
            let tokens = random_tokens(&mut r, 60, 64, 12);
            let cap = 8 + (r() % 40) as usize;
            let floor = belady(cap, &tokens);
            let hot: Vec<BlockId> = (0..(cap as BlockId / 2)).collect();
            for p in Policy::ALL {
                let s = simulate(p, cap, &hot, &tokens).unwrap();
                assert_eq!(s.accesses, floor.accesses);
                assert!(
                    s.misses >= floor.misses,
                    "case {case} {p}: {s:?} < {floor:?}"
                );
            }
        }
    }

    #[test]
    fn belady_is_a_floor_on_adversarial_sequences() {
        // A cyclic scan one block larger than the cache: LRU misses every access.
        let cap = 4;
        let scan: Vec<Vec<BlockId>> = (0..50).map(|t| vec![(t % 5) as BlockId]).collect();
        let lru = simulate(Policy::Lru, cap, &[], &scan).unwrap();
        assert_eq!(lru.misses, 50);
        let floor = belady(cap, &scan);
        assert!(floor.misses < lru.misses / 2, "{floor:?}");
        // A block used often early and never again pollutes LFU.
        let mut seq: Vec<Vec<BlockId>> = (0..20).map(|_| vec![0, 1]).collect();
        seq.extend((0..30).map(|t| vec![2 + (t % 2) as BlockId]));
        let lfu = simulate(Policy::Lfu, 2, &[], &seq).unwrap();
        let floor = belady(2, &seq);
        assert_eq!(floor.misses, 4);
        assert!(lfu.misses > floor.misses, "{lfu:?}");
        for p in Policy::ALL {
            for t in [&scan, &seq] {
                let hot = [0];
                assert!(simulate(p, 2, &hot, t).unwrap().misses >= belady(2, t).misses);
            }
        }
    }

    #[test]
    fn hot_needs_a_free_slot() {
        let e = simulate(Policy::Hot, 2, &[0, 1], &[vec![0]]).unwrap_err();
        assert!(e.to_string().contains("2 pinned hot blocks"), "{e}");
    }

    /// A hot set reused every token beside a scan of blocks used once: LRU thrashes, the
    /// learned policy (used more than once: back next token; else far) keeps the hot set, and
    /// no policy beats Belady.
    #[test]
    fn learned_eviction_keeps_what_it_predicts_back_soon() {
        let mut seq = Vec::new();
        let mut next = 100;
        for _ in 0..50 {
            let mut step = vec![0, 1, 2, 3];
            for _ in 0..3 {
                step.push(next);
                next += 1;
            }
            seq.push(step);
        }
        let table = std::sync::Arc::new(crate::predict::reuse::tests::table());
        let learned = simulate_learned(table, 6, &seq).unwrap();
        let lru = simulate(Policy::Lru, 6, &[], &seq).unwrap();
        let floor = belady(6, &seq);
        assert_eq!(lru.misses, lru.accesses, "LRU thrashes: {lru:?}");
        // The scan's 150 first uses, the hot set's cold misses and a few early guesses.
        assert!(learned.misses <= 150 + 4 + 12, "{learned:?}");
        assert!(learned.misses >= floor.misses, "{learned:?} {floor:?}");
    }
}
