//! The weight cache's policies on small sequences whose answers are known by hand, run both on
//! the cache (slots carved from the FFN-cache arena, flags in the flags arena) and in the
//! simulator, which must agree with it.

use leanstream::boot::{Arena, ArenaKind};
use leanstream::stream::sim::{belady, simulate};
use leanstream::stream::{flags_from_words, BlockId, Policy, WeightCache, FLAG_READY};

const A: BlockId = 0;
const B: BlockId = 1;
const C: BlockId = 2;

/// Runs `seq` (one block per token) through a cache of `slots`: the misses, and the blocks
/// resident at the end.
fn run(policy: Policy, slots: usize, hot: &[BlockId], seq: &[BlockId]) -> (u64, Vec<BlockId>) {
    let mut ffn = Arena::map(ArenaKind::FfnCache, slots * 64).unwrap();
    let mut fl = Arena::map(ArenaKind::Flags, 4096).unwrap();
    let flags = flags_from_words(fl.carver().take::<u32>(16).unwrap());
    let arena = ffn.carver().take::<u8>(slots * 64).unwrap();
    let mut cache = WeightCache::new(arena, 64, slots, policy, flags, hot, None).unwrap();
    for &b in seq {
        if cache.lookup(b).is_none() {
            cache.insert(b, &[b as u8; 64]).unwrap();
        }
        assert_eq!(cache.get(b).unwrap(), &[b as u8; 64]);
    }
    let tokens: Vec<Vec<BlockId>> = seq.iter().map(|&b| vec![b]).collect();
    let sim = simulate(policy, slots, hot, &tokens).unwrap();
    let s = cache.stats();
    assert_eq!(
        sim.misses, s.misses,
        "{policy}: the simulator and the cache disagree"
    );
    assert!(belady(slots, &tokens).misses <= s.misses);
    let resident = (0..16).filter(|&b| cache.flag(b) == FLAG_READY).collect();
    (s.misses, resident)
}

#[test]
fn lfu_keeps_the_frequent_block_where_lru_drops_it() {
    // A A A B C A with two slots: LRU evicts A for C; LFU evicts B (used once).
    let seq = [A, A, A, B, C, A];
    assert_eq!(run(Policy::Lru, 2, &[], &seq), (4, vec![A, C]));
    assert_eq!(run(Policy::Lfu, 2, &[], &seq), (3, vec![A, C]));
}

#[test]
fn lru_follows_a_shifting_working_set_where_lfu_clings_to_history() {
    // A A A then B C alternating: LRU settles on {B, C}; LFU keeps A (3 uses) until B and C
    // have each been used as often, missing on every B and C until then.
    let seq = [A, A, A, B, C, B, C, B, C];
    assert_eq!(run(Policy::Lru, 2, &[], &seq), (3, vec![B, C]));
    assert_eq!(run(Policy::Lfu, 2, &[], &seq), (7, vec![B, C]));
}

#[test]
fn hot_blocks_stay_pinned_and_the_rest_is_lfu() {
    // A is profiled hot: once loaded it is never evicted; B and C share the other slot.
    let seq = [A, B, C, B, C, A, A];
    let (misses, resident) = run(Policy::Hot, 2, &[A], &seq);
    assert_eq!(misses, 5);
    assert!(resident.contains(&A));
    // LRU on the same sequence drops A and pays for it again.
    assert_eq!(run(Policy::Lru, 2, &[], &seq).0, 4);
}

#[test]
fn every_policy_equals_belady_when_everything_fits() {
    let seq = [A, B, C, A, B, C, C, B, A];
    for p in Policy::ALL {
        let hot: &[BlockId] = if p == Policy::Hot { &[A] } else { &[] };
        assert_eq!(run(p, 3, hot, &seq).0, 3, "{p}: only cold misses");
    }
}
