//! Which block leaves the cache: the replacement state the weight cache and the simulator share,
//! so a figure measures the code that runs. Slots are numbers here; the bytes are the cache's.
//!
//! Every evictable slot sits in one min-heap keyed by what the policy would keep longest:
//! - `lru`: the tick of the last access;
//! - `lfu`: the block's access count over the whole run (kept across evictions, so a block that
//!   was often used comes back with its history), ties broken by recency;
//! - `hot` (PowerInfer-2): the given hot blocks are pinned once loaded, the rest are LFU;
//! - `learned` (paper 3.3.3): each access predicts the block's reuse distance from its recent
//!   inter-arrival times (`predict::reuse`); the victim is, among `SAMPLES` evictable slots
//!   drawn at random, the one whose predicted next use is farthest (a block past its predicted
//!   use counts by the time since its last access, as LRU would). The heap is then only the set
//!   of evictable slots.
//!
//! Pinned slots are not in the heap, so they are never evicted. O(log slots) per access.

use super::BlockId;
use crate::predict::reuse::{ReuseTable, HISTORY, NEVER};
use std::fmt;
use std::sync::Arc;

/// Evictable slots the `learned` policy compares per eviction.
pub const SAMPLES: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Lru,
    Lfu,
    Hot,
    /// Needs its table (`Replacement::learned`, `--eviction`).
    Learned,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Lru, Policy::Lfu, Policy::Hot];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::Hot => "hot",
            Policy::Learned => "learned",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            "hot" | "powerinfer2" => Ok(Policy::Hot),
            "learned" => Ok(Policy::Learned),
            _ => Err(format!(
                "unknown cache policy '{s}' (expected lru, lfu, hot or learned)"
            )),
        }
    }
}

const NONE: u32 = u32::MAX;
/// Access counts saturate here, so (count, tick) packs into one u64 key.
const MAX_COUNT: u64 = (1 << 23) - 1;
const TICK_BITS: u32 = 40;

/// The replacement state of `slots` slots over blocks `0..blocks`.
pub struct Replacement {
    policy: Policy,
    /// Per slot: the block it holds, or NONE.
    block_of: Vec<u32>,
    /// Per block: its slot, or NONE.
    slot_of: Vec<u32>,
    /// Per block: accesses so far (LFU).
    count: Vec<u32>,
    /// Per block: how many holders pin it (never evicted while resident and above 0): the
    /// hot set, a layer computing over it, a finished read not yet handed out.
    pinned: Vec<u16>,
    /// Per slot: its heap key, and its place in the heap (NONE: not evictable).
    key: Vec<u64>,
    pos: Vec<u32>,
    heap: Vec<u32>,
    free: Vec<u32>,
    tick: u64,
    reuse: Option<Reuse>,
}

/// The `learned` policy's state: its table and, per block, what its features need.
struct Reuse {
    table: Arc<ReuseTable>,
    /// Per block: the tick of its last access (u64::MAX: none), its last gaps (newest first),
    /// and the distance predicted at its last access.
    last: Vec<u64>,
    gaps: Vec<[u32; HISTORY]>,
    predicted: Vec<u32>,
    /// The sampling's xorshift state (fixed seed: runs repeat).
    rng: u64,
}

impl Replacement {
    pub fn new(policy: Policy, slots: usize, blocks: usize) -> Replacement {
        assert!(
            policy != Policy::Learned,
            "the learned policy needs its table: Replacement::learned"
        );
        Self::make(policy, slots, blocks)
    }

    /// The `learned` policy with its reuse-distance table.
    pub fn learned(slots: usize, blocks: usize, table: Arc<ReuseTable>) -> Replacement {
        let mut r = Self::make(Policy::Learned, slots, blocks);
        r.reuse = Some(Reuse {
            table,
            last: vec![u64::MAX; blocks],
            gaps: vec![[NEVER; HISTORY]; blocks],
            predicted: vec![0; blocks],
            rng: 0x2545_f491_4f6c_dd1d,
        });
        r
    }

    fn make(policy: Policy, slots: usize, blocks: usize) -> Replacement {
        Replacement {
            policy,
            block_of: vec![NONE; slots],
            slot_of: vec![NONE; blocks],
            count: vec![0; blocks],
            pinned: vec![0; blocks],
            key: vec![0; slots],
            pos: vec![NONE; slots],
            heap: Vec::with_capacity(slots),
            free: (0..slots as u32).rev().collect(),
            tick: 0,
            reuse: None,
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn slots(&self) -> usize {
        self.block_of.len()
    }

    pub fn blocks(&self) -> usize {
        self.slot_of.len()
    }

    /// The slot holding `block`, without counting an access.
    pub fn slot_of(&self, block: BlockId) -> Option<usize> {
        let s = self.slot_of[block as usize];
        (s != NONE).then_some(s as usize)
    }

    pub fn block_in(&self, slot: usize) -> Option<BlockId> {
        let b = self.block_of[slot];
        (b != NONE).then_some(b)
    }

    pub fn is_pinned(&self, block: BlockId) -> bool {
        self.pinned[block as usize] > 0
    }

    fn key_for(&self, block: BlockId) -> u64 {
        match self.policy {
            Policy::Lru | Policy::Learned => self.tick,
            Policy::Lfu | Policy::Hot => {
                let c = (self.count[block as usize] as u64).min(MAX_COUNT);
                (c << TICK_BITS) | (self.tick & ((1 << TICK_BITS) - 1))
            }
        }
    }

    /// Records an access to `block`: its slot when resident (a hit).
    pub fn access(&mut self, block: BlockId) -> Option<usize> {
        self.tick += 1;
        let b = block as usize;
        self.count[b] = self.count[b].saturating_add(1);
        if let Some(r) = self.reuse.as_mut() {
            let gap = match r.last[b] {
                u64::MAX => NEVER,
                last => (self.tick - last).min(NEVER as u64) as u32,
            };
            let g = &mut r.gaps[b];
            g.copy_within(0..HISTORY - 1, 1);
            g[0] = gap;
            r.last[b] = self.tick;
            r.predicted[b] = r.table.distance(g, self.count[b]);
        }
        let s = self.slot_of[b];
        if s == NONE {
            return None;
        }
        let s = s as usize;
        if self.pos[s] != NONE {
            self.key[s] = self.key_for(block);
            self.sift_down(self.pos[s] as usize);
        }
        Some(s)
    }

    /// Whether inserting now would need to evict, and could.
    pub fn has_room(&self) -> bool {
        !self.free.is_empty() || !self.heap.is_empty()
    }

    /// Gives `block` (not resident) a slot: a free one, or the policy's victim's. Returns the
    /// slot and the evicted block; `None` when every slot is pinned.
    pub fn insert(&mut self, block: BlockId) -> Option<(usize, Option<BlockId>)> {
        debug_assert_eq!(self.slot_of[block as usize], NONE, "block {block} resident");
        let (slot, evicted) = match self.free.pop() {
            Some(s) => (s as usize, None),
            None => {
                if self.heap.is_empty() {
                    return None;
                }
                let s = match self.reuse.is_some() {
                    true => self.learned_victim(),
                    false => self.heap[0] as usize,
                };
                self.heap_remove(s);
                let victim = self.block_of[s];
                self.slot_of[victim as usize] = NONE;
                (s, Some(victim))
            }
        };
        self.block_of[slot] = block;
        self.slot_of[block as usize] = slot as u32;
        if self.pinned[block as usize] == 0 {
            self.key[slot] = self.key_for(block);
            self.heap_push(slot);
        }
        Some((slot, evicted))
    }

    /// Empties `block`'s slot (the block's data is gone); its access history stays.
    pub fn remove(&mut self, block: BlockId) {
        let s = self.slot_of[block as usize];
        if s == NONE {
            return;
        }
        let s = s as usize;
        if self.pos[s] != NONE {
            self.heap_remove(s);
        }
        self.block_of[s] = NONE;
        self.slot_of[block as usize] = NONE;
        self.free.push(s as u32);
    }

    /// Pins `block` once more: never evicted while resident (now or when it arrives) until
    /// every pin is undone by an `unpin`.
    pub fn pin(&mut self, block: BlockId) {
        let p = &mut self.pinned[block as usize];
        *p = p.checked_add(1).expect("pin count overflow");
        if let Some(s) = self.slot_of(block) {
            if self.pos[s] != NONE {
                self.heap_remove(s);
            }
        }
    }

    /// Undoes one pin of `block`; with none left it is evictable again.
    pub fn unpin(&mut self, block: BlockId) {
        let p = &mut self.pinned[block as usize];
        if *p == 0 {
            return;
        }
        *p -= 1;
        if *p > 0 {
            return;
        }
        if let Some(s) = self.slot_of(block) {
            self.key[s] = self.key_for(block);
            self.heap_push(s);
        }
    }

    /// Among up to `SAMPLES` evictable slots drawn at random, the one whose block's predicted
    /// next use is farthest from now.
    fn learned_victim(&mut self) -> usize {
        let r = self.reuse.as_mut().expect("the learned policy");
        let n = self.heap.len();
        let (mut best, mut best_far) = (self.heap[0] as usize, 0u64);
        for _ in 0..SAMPLES.min(n) {
            r.rng ^= r.rng << 13;
            r.rng ^= r.rng >> 7;
            r.rng ^= r.rng << 17;
            let s = self.heap[(r.rng % n as u64) as usize] as usize;
            let b = self.block_of[s] as usize;
            let last = r.last[b].min(self.tick);
            let next = last + r.predicted[b] as u64;
            let far = if next > self.tick {
                next - self.tick
            } else {
                self.tick - last
            };
            if far >= best_far {
                (best, best_far) = (s, far);
            }
        }
        best
    }

    fn heap_push(&mut self, slot: usize) {
        self.pos[slot] = self.heap.len() as u32;
        self.heap.push(slot as u32);
        self.sift_up(self.heap.len() - 1);
    }

    fn heap_remove(&mut self, slot: usize) {
        let i = self.pos[slot] as usize;
        let last = self.heap.len() - 1;
        self.swap(i, last);
        self.heap.pop();
        self.pos[slot] = NONE;
        if i < self.heap.len() {
            self.sift_up(i);
            self.sift_down(i);
        }
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.pos[self.heap[i] as usize] = i as u32;
        self.pos[self.heap[j] as usize] = j as u32;
    }

    fn less(&self, i: usize, j: usize) -> bool {
        self.key[self.heap[i] as usize] < self.key[self.heap[j] as usize]
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if self.less(i, p) {
                self.swap(i, p);
                i = p;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && self.less(l, m) {
                m = l;
            }
            if r < n && self.less(r, m) {
                m = r;
            }
            if m == i {
                break;
            }
            self.swap(i, m);
            i = m;
        }
    }
}
