//! The weight cache: a fixed number of block slots carved from the FFN-cache arena, a
//! replacement policy ([`Policy`]) and the flags that say which blocks are in it.
//!
//! The flag invariant (the flags arena, one `AtomicU32` per block): `flags[b]` is
//! [`FLAG_READY`] only while block `b`'s whole bytes are in its slot. [`WeightCache::insert`]
//! clears the evicted block's flag (Release) before its slot is overwritten, copies the new
//! block, and only then sets the new block's flag (Release); a reader that loads `READY` with
//! Acquire sees the whole block. A block whose read failed is never inserted, so no slot ever
//! holds part of a block.

use super::policy::{Policy, Replacement};
use super::{BlockId, StreamError, FLAG_EMPTY, FLAG_FAILED, FLAG_READY};
use crate::boot::SLICE_ALIGN;
use crate::predict::reuse::ReuseTable;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// How much of the FFN the cache may hold: a fraction of the model's FFN bytes, or bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheBudget {
    Fraction(f64),
    Bytes(usize),
}

impl CacheBudget {
    /// Slots of `slot_bytes` this budget buys when the whole FFN is `ffn_bytes`.
    pub fn slots(self, ffn_bytes: usize, slot_bytes: usize) -> usize {
        let bytes = match self {
            CacheBudget::Fraction(f) => (ffn_bytes as f64 * f.clamp(0.0, 1.0)) as usize,
            CacheBudget::Bytes(b) => b,
        };
        bytes / slot_bytes.max(1)
    }
}

impl std::str::FromStr for CacheBudget {
    type Err = String;
    /// `25%`, `0.25` (a fraction), or bytes: `1048576`, `512 MiB`, `2GiB`, `64KiB`.
    fn from_str(s: &str) -> Result<CacheBudget, String> {
        let t = s.trim();
        let bad = || {
            format!("bad cache budget '{s}' (expected a percentage, a fraction like 0.25, or bytes like 512MiB)")
        };
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            return if (0.0..=100.0).contains(&v) {
                Ok(CacheBudget::Fraction(v / 100.0))
            } else {
                Err(bad())
            };
        }
        if t.contains('.') {
            let v: f64 = t.parse().map_err(|_| bad())?;
            return if (0.0..=1.0).contains(&v) {
                Ok(CacheBudget::Fraction(v))
            } else {
                Err(bad())
            };
        }
        let (num, mult) = [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
            .iter()
            .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m)))
            .unwrap_or((t, 1));
        let v: usize = num.parse().map_err(|_| bad())?;
        Ok(CacheBudget::Bytes(v * mult))
    }
}

/// What the cache and the lanes feeding it have done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes of whole blocks brought in from disk.
    pub bytes_read: u64,
    pub evictions: u64,
    /// The most reads queued and in flight at once.
    pub max_queue_depth: u64,
    /// Reads that failed after every retry.
    pub failed_reads: u64,
}

impl CacheStats {
    pub fn miss_ratio(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.misses as f64 / n as f64
        }
    }
}

pub struct WeightCache<'a> {
    data: &'a mut [u8],
    slot_bytes: usize,
    stride: usize,
    /// Bytes of the block each slot holds.
    len: Vec<u32>,
    repl: Replacement,
    flags: &'a [AtomicU32],
    stats: CacheStats,
}

impl<'a> WeightCache<'a> {
    /// `slots` slots of `slot_bytes` from `arena` (carved from `boot::Arenas::ffn`), one flag
    /// per block in `flags` (all cleared now). With `Policy::Hot`, `hot` are pinned once they
    /// arrive; the other policies ignore it. `Policy::Learned` takes its table in `reuse`.
    pub fn new(
        arena: &'a mut [u8],
        slot_bytes: usize,
        slots: usize,
        policy: Policy,
        flags: &'a [AtomicU32],
        hot: &[BlockId],
        reuse: Option<Arc<ReuseTable>>,
    ) -> Result<WeightCache<'a>, StreamError> {
        if slot_bytes == 0 || slots == 0 {
            return Err(StreamError::Config(
                "the weight cache needs at least one slot of at least one byte",
            ));
        }
        let stride = slot_bytes.div_ceil(SLICE_ALIGN) * SLICE_ALIGN;
        let needed = stride.saturating_mul(slots);
        if needed > arena.len() {
            return Err(StreamError::CacheArena {
                slots,
                slot_bytes,
                needed,
                available: arena.len(),
            });
        }
        if policy == Policy::Hot && hot.len() >= slots {
            return Err(StreamError::TooManyHot {
                hot: hot.len(),
                slots,
            });
        }
        if let Some(&b) = hot.iter().find(|&&b| b as usize >= flags.len()) {
            return Err(StreamError::Flags {
                blocks: b as usize + 1,
                flags: flags.len(),
            });
        }
        for f in flags {
            f.store(FLAG_EMPTY, Ordering::Release);
        }
        let mut repl = match (policy, reuse) {
            (Policy::Learned, Some(t)) => Replacement::learned(slots, flags.len(), t),
            (Policy::Learned, None) => {
                return Err(StreamError::Config(
                    "the learned cache policy needs its eviction table",
                ))
            }
            _ => Replacement::new(policy, slots, flags.len()),
        };
        if policy == Policy::Hot {
            for &b in hot {
                repl.pin(b);
            }
        }
        Ok(WeightCache {
            data: &mut arena[..needed],
            slot_bytes,
            stride,
            len: vec![0; slots],
            repl,
            flags,
            stats: CacheStats::default(),
        })
    }

    pub fn policy(&self) -> Policy {
        self.repl.policy()
    }

    pub fn slots(&self) -> usize {
        self.repl.slots()
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes from one slot's start to the next's in the arena (a GPU reads slot s at
    /// `arena + s * slot_stride`).
    pub fn slot_stride(&self) -> usize {
        self.stride
    }

    /// Blocks numbered below this have a flag.
    pub fn blocks(&self) -> usize {
        self.flags.len()
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }

    /// The token needs `block`: its slot on a hit (counted, and recency/frequency updated), or
    /// `None` on a miss (counted).
    pub fn lookup(&mut self, block: BlockId) -> Option<usize> {
        let hit = self.repl.access(block);
        if hit.is_some() {
            self.stats.hits += 1;
        } else {
            self.stats.misses += 1;
        }
        hit
    }

    /// `block`'s slot, counting nothing.
    pub fn slot_of(&self, block: BlockId) -> Option<usize> {
        self.repl.slot_of(block)
    }

    /// The bytes of the block in `slot`.
    pub fn slot(&self, slot: usize) -> &[u8] {
        let start = slot * self.stride;
        &self.data[start..start + self.len[slot] as usize]
    }

    /// `block`'s bytes when cached, counting nothing.
    pub fn get(&self, block: BlockId) -> Option<&[u8]> {
        self.slot_of(block).map(|s| self.slot(s))
    }

    /// `block`'s flag (Acquire): [`FLAG_READY`] means its whole bytes are in its slot.
    pub fn flag(&self, block: BlockId) -> u32 {
        self.flags[block as usize].load(Ordering::Acquire)
    }

    /// Puts a whole block in the cache, evicting the policy's victim when full; its slot, or
    /// `None` when every slot is pinned (nothing changed). A block already cached is replaced
    /// in its slot.
    pub fn insert(&mut self, block: BlockId, bytes: &[u8]) -> Option<usize> {
        assert!(
            bytes.len() <= self.slot_bytes,
            "block {block} of {} bytes in slots of {}",
            bytes.len(),
            self.slot_bytes
        );
        let flag = &self.flags[block as usize];
        let slot = match self.repl.slot_of(block) {
            Some(s) => {
                flag.store(FLAG_EMPTY, Ordering::Release);
                s
            }
            None => {
                let (s, evicted) = self.repl.insert(block)?;
                if let Some(v) = evicted {
                    // Cleared before the slot is overwritten: nobody reads the victim from it.
                    self.flags[v as usize].store(FLAG_EMPTY, Ordering::Release);
                    self.stats.evictions += 1;
                }
                s
            }
        };
        let start = slot * self.stride;
        self.data[start..start + bytes.len()].copy_from_slice(bytes);
        self.len[slot] = bytes.len() as u32;
        self.stats.bytes_read += bytes.len() as u64;
        // Published after the copy: an Acquire load of READY sees the whole block.
        flag.store(FLAG_READY, Ordering::Release);
        Some(slot)
    }

    /// Drops `block` from the cache (its flag cleared first).
    pub fn evict(&mut self, block: BlockId) {
        if self.repl.slot_of(block).is_some() {
            self.flags[block as usize].store(FLAG_EMPTY, Ordering::Release);
            self.repl.remove(block);
        }
    }

    /// Pins `block` once more (now or when it arrives): never evicted until each pin is undone.
    pub fn pin(&mut self, block: BlockId) {
        self.repl.pin(block);
    }

    pub fn unpin(&mut self, block: BlockId) {
        self.repl.unpin(block);
    }

    pub fn is_pinned(&self, block: BlockId) -> bool {
        self.repl.is_pinned(block)
    }

    /// Whether a block could be inserted now (a free slot or an evictable one).
    pub fn has_room(&self) -> bool {
        self.repl.has_room()
    }

    /// Marks `block`'s read as failed for good (its flag says so; nothing is cached).
    pub fn mark_failed(&mut self, block: BlockId) {
        self.flags[block as usize].store(FLAG_FAILED, Ordering::Release);
        self.stats.failed_reads += 1;
    }

    /// Clears a failed block's flag before it is read again.
    pub fn clear_failed(&mut self, block: BlockId) {
        let _ = self.flags[block as usize].compare_exchange(
            FLAG_FAILED,
            FLAG_EMPTY,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Records the reads queued and in flight now.
    pub fn note_queue_depth(&mut self, depth: usize) {
        self.stats.max_queue_depth = self.stats.max_queue_depth.max(depth as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(7)).collect()
    }

    #[test]
    fn refuses_slots_the_arena_cannot_hold_in_one_sentence() {
        let mut arena = vec![0u8; 4096];
        let f = flags(8);
        let e = WeightCache::new(&mut arena, 1024, 5, Policy::Lru, &f, &[], None)
            .err()
            .unwrap();
        let msg = e.to_string();
        assert_eq!(
            msg,
            "the weight cache's 5 slots of 1024 bytes need 5120 bytes but budget.ffn_cache gives 4096"
        );
        let e = WeightCache::new(&mut arena, 64, 2, Policy::Hot, &f, &[1, 2], None)
            .err()
            .unwrap();
        assert!(matches!(e, StreamError::TooManyHot { hot: 2, slots: 2 }));
    }

    #[test]
    fn insert_evicts_and_moves_flags_with_the_bytes() {
        let mut arena = vec![0u8; 4 * 64];
        let f = flags(8);
        let mut c = WeightCache::new(&mut arena, 64, 2, Policy::Lru, &f, &[], None).unwrap();
        assert!(
            (0..8).all(|b| c.flag(b) == FLAG_EMPTY),
            "flags cleared at construction"
        );
        assert_eq!(c.lookup(1), None);
        c.insert(1, &[1; 64]).unwrap();
        assert_eq!(c.lookup(2), None);
        c.insert(2, &[2; 30]).unwrap();
        assert_eq!(c.lookup(1), Some(c.slot_of(1).unwrap()));
        assert_eq!(c.lookup(3), None);
        c.insert(3, &[3; 64]).unwrap(); // evicts 2, the least recently used
        assert_eq!(
            (c.flag(1), c.flag(2), c.flag(3)),
            (FLAG_READY, FLAG_EMPTY, FLAG_READY)
        );
        assert_eq!(c.get(2), None);
        assert_eq!(c.get(3).unwrap(), &[3; 64]);
        let s = c.stats();
        assert_eq!(
            (s.hits, s.misses, s.evictions, s.bytes_read),
            (1, 3, 1, 64 + 30 + 64)
        );
    }

    #[test]
    fn pinned_blocks_stay_and_a_full_pinned_cache_refuses() {
        let mut arena = vec![0u8; 2 * 64];
        let f = flags(8);
        let mut c = WeightCache::new(&mut arena, 64, 2, Policy::Lfu, &f, &[], None).unwrap();
        c.pin(0);
        c.pin(1);
        c.insert(0, &[0; 8]).unwrap();
        c.insert(1, &[1; 8]).unwrap();
        assert_eq!(c.insert(2, &[2; 8]), None);
        assert_eq!(c.flag(2), FLAG_EMPTY);
        c.unpin(1);
        assert!(c.insert(2, &[2; 8]).is_some());
        assert_eq!(
            (c.flag(0), c.flag(1), c.flag(2)),
            (FLAG_READY, FLAG_EMPTY, FLAG_READY)
        );
    }

    #[test]
    fn budgets_parse_and_size() {
        let p = |s: &str| s.parse::<CacheBudget>();
        assert_eq!(p("25%"), Ok(CacheBudget::Fraction(0.25)));
        assert_eq!(p("0.5"), Ok(CacheBudget::Fraction(0.5)));
        assert_eq!(p("512MiB"), Ok(CacheBudget::Bytes(512 << 20)));
        assert_eq!(p("4096"), Ok(CacheBudget::Bytes(4096)));
        assert!(p("150%").is_err() && p("1.5").is_err() && p("lots").is_err());
        assert_eq!(CacheBudget::Fraction(0.25).slots(1 << 20, 4096), 64);
        assert_eq!(CacheBudget::Bytes(10_000).slots(1 << 20, 4096), 2);
    }
}
