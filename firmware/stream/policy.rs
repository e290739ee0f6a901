//! Which block leaves the cache: the replacement state the weight cache and the simulator share,
//! so a figure measures the code that runs. Slots are numbers here; the bytes are the cache's.
//!
//! Every evictable slot sits in one min-heap keyed by what the policy would keep longest:
//! - `lru`: the tick of the last access;
//! - `lfu`: the block's access count over the whole run (kept across evictions, so a block that
//!   was often used comes back with its history), ties broken by recency;
//! - `hot` (PowerInfer-2): the given hot blocks are pinned once loaded, the rest are LFU;
//! - `learned` (paper 3.3.3): the predicted tokens until the block's next use, from its access
//!   history in tokens (`predict::reuse`), ties broken by recency: the victim is the block
//!   whose predicted next use is farthest. A block's prediction is made at each access and
//!   again, for every evictable slot, when a token begins (its history has moved on a token:
//!   a block not back when predicted is now predicted from its longer absence).
//!
//! Pinned slots are not in the heap, so they are never evicted. O(log slots) per access; the
//! `learned` policy adds one table inference per access and per evictable slot per token.

use super::BlockId;
use crate::predict::reuse::{History, ReuseTable, FEATURES, HORIZON};
use std::fmt;
use std::sync::Arc;

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
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;
/// The `learned` policy's predicted distances, in 1/16 token, range below this.
const FAR_STEPS: u64 = (HORIZON as u64 + 2) * 16;

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

/// The `learned` policy's state: its table and every block's history (the token clock).
struct Reuse {
    table: Arc<ReuseTable>,
    history: History,
}

impl Reuse {
    /// `block`'s heap key: smaller for a farther predicted next use (evicted first), then for
    /// an older last access (`tick`).
    fn key(&self, block: BlockId, tick: u64) -> u64 {
        let mut x = [0f32; FEATURES];
        let base = self.history.features(block as usize, &mut x);
        let far = (base - self.history.now()) as f32 + self.table.distance_of(&x);
        let steps = ((far * 16.0) as u64).min(FAR_STEPS - 1);
        ((FAR_STEPS - 1 - steps) << TICK_BITS) | (tick & TICK_MASK)
    }
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
            history: History::new(blocks),
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
        match (self.policy, &self.reuse) {
            (Policy::Learned, Some(r)) => r.key(block, self.tick),
            (Policy::Lfu | Policy::Hot, _) => {
                let c = (self.count[block as usize] as u64).min(MAX_COUNT);
                (c << TICK_BITS) | (self.tick & TICK_MASK)
            }
            _ => self.tick,
        }
    }

    /// A token began: every evictable block's prediction again (its last access's tick kept
    /// for ties), then the heap rebuilt in place.
    fn repredict(&mut self) {
        let Some(r) = self.reuse.as_ref() else {
            return;
        };
        for &s in &self.heap {
            let s = s as usize;
            self.key[s] = r.key(self.block_of[s], self.key[s]);
        }
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
    }

    /// Records an access to `block`: its slot when resident (a hit).
    pub fn access(&mut self, block: BlockId) -> Option<usize> {
        self.tick += 1;
        let b = block as usize;
        self.count[b] = self.count[b].saturating_add(1);
        if let Some(r) = self.reuse.as_mut() {
            if r.history.begin(b) {
                self.repredict();
            }
            self.reuse.as_mut().expect("learned").history.record(b);
        }
        let s = self.slot_of[b];
        if s == NONE {
            return None;
        }
        let s = s as usize;
        if self.pos[s] != NONE {
            self.key[s] = self.key_for(block);
            // A learned key may fall or rise; the others only rise.
            let i = self.pos[s] as usize;
            self.sift_up(i);
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
                let s = self.heap[0] as usize;
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
