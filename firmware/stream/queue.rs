//! The queue of block reads not yet submitted: a binary max-heap on priority in a buffer sized
//! once, whose entries can be re-ranked or dropped in place when the prediction changes, and
//! found by block in O(1) (a position index over every block id, so the lanes can take a
//! block's queued neighbours into one read). Equal priorities leave in the order they were
//! pushed.

use super::{BlockId, BlockRead};

#[derive(Clone, Copy, Debug)]
struct Entry {
    read: BlockRead,
    priority: f32,
    /// Push order, for FIFO among equal priorities.
    seq: u64,
}

impl Entry {
    /// `self` leaves before `other`.
    fn before(&self, other: &Entry) -> bool {
        self.priority > other.priority || (self.priority == other.priority && self.seq < other.seq)
    }
}

/// `pos` of a block not in the queue.
const ABSENT: u32 = u32::MAX;

pub struct ReadQueue {
    heap: Vec<Entry>,
    /// Per block id: its index in `heap`, or `ABSENT`.
    pos: Vec<u32>,
    capacity: usize,
    seq: u64,
}

impl ReadQueue {
    /// Room for `capacity` reads of blocks `0..blocks`.
    pub fn with_capacity(capacity: usize, blocks: usize) -> ReadQueue {
        ReadQueue {
            heap: Vec::with_capacity(capacity),
            pos: vec![ABSENT; blocks],
            capacity,
            seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues `read` at `priority` (higher leaves first); `Err(read)` when full. The block must
    /// be below the queue's `blocks` and not queued already (the lanes check both).
    pub fn push(&mut self, read: BlockRead, priority: f32) -> Result<(), BlockRead> {
        if self.heap.len() == self.capacity {
            return Err(read);
        }
        let b = read.block as usize;
        assert!(
            b < self.pos.len() && self.pos[b] == ABSENT,
            "block {b} queued twice or beyond the queue's {} blocks",
            self.pos.len()
        );
        self.pos[b] = self.heap.len() as u32;
        self.seq += 1;
        self.heap.push(Entry {
            read,
            priority,
            seq: self.seq,
        });
        self.sift_up(self.heap.len() - 1);
        Ok(())
    }

    /// The highest-priority read, removed.
    pub fn pop(&mut self) -> Option<(BlockRead, f32)> {
        if self.heap.is_empty() {
            return None;
        }
        let top = self.take(0);
        if !self.heap.is_empty() {
            self.sift_down(0);
        }
        Some((top.read, top.priority))
    }

    /// Removes `heap[i]` (the last entry takes its place, not yet sifted).
    fn take(&mut self, i: usize) -> Entry {
        let gone = self.heap.swap_remove(i);
        self.pos[gone.read.block as usize] = ABSENT;
        if i < self.heap.len() {
            self.pos[self.heap[i].read.block as usize] = i as u32;
        }
        gone
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.pos[self.heap[i].read.block as usize] = i as u32;
        self.pos[self.heap[j].read.block as usize] = j as u32;
    }

    pub fn peek(&self) -> Option<(BlockRead, f32)> {
        self.heap.first().map(|e| (e.read, e.priority))
    }

    fn position(&self, block: BlockId) -> Option<usize> {
        match self.pos.get(block as usize) {
            Some(&i) if i != ABSENT => Some(i as usize),
            _ => None,
        }
    }

    /// The queued read of `block`, left in the queue.
    pub fn get(&self, block: BlockId) -> Option<BlockRead> {
        self.position(block).map(|i| self.heap[i].read)
    }

    pub fn contains(&self, block: BlockId) -> bool {
        self.position(block).is_some()
    }

    /// Sets a queued block's priority; false when it is not queued.
    pub fn set_priority(&mut self, block: BlockId, priority: f32) -> bool {
        let Some(i) = self.position(block) else {
            return false;
        };
        self.heap[i].priority = priority;
        self.sift_up(i);
        let i = self.position(block).expect("still queued");
        self.sift_down(i);
        true
    }

    /// Drops a queued block; its read, or `None` when it was not queued.
    pub fn remove(&mut self, block: BlockId) -> Option<BlockRead> {
        let i = self.position(block)?;
        let gone = self.take(i);
        if i < self.heap.len() {
            self.sift_up(i);
            self.sift_down(i);
        }
        Some(gone.read)
    }

    /// Re-ranks every queued read from a per-block table of priorities (`priorities[block]`;
    /// blocks past its end count as 0). A read whose new priority is not above 0 (or is NaN) is
    /// dropped and handed to `dropped`. Returns how many were dropped.
    pub fn rerank(&mut self, priorities: &[f32], mut dropped: impl FnMut(BlockRead)) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.heap.len() {
            let b = self.heap[i].read.block as usize;
            let p = priorities.get(b).copied().unwrap_or(0.0);
            if p > 0.0 {
                self.heap[i].priority = p;
                i += 1;
            } else {
                dropped(self.take(i).read);
                n += 1;
            }
        }
        // Heapify bottom-up: O(n).
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
        n
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[i].before(&self.heap[parent]) {
                self.swap(i, parent);
                i = parent;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < n && self.heap[l].before(&self.heap[best]) {
                best = l;
            }
            if r < n && self.heap[r].before(&self.heap[best]) {
                best = r;
            }
            if best == i {
                break;
            }
            self.swap(i, best);
            i = best;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::FileId;

    fn read(block: BlockId) -> BlockRead {
        BlockRead {
            file: FileId(0),
            offset: block as u64 * 4096,
            len: 4096,
            block,
        }
    }

    fn drain(q: &mut ReadQueue) -> Vec<BlockId> {
        std::iter::from_fn(|| q.pop().map(|(r, _)| r.block)).collect()
    }

    #[test]
    fn highest_first_fifo_among_equals() {
        let mut q = ReadQueue::with_capacity(8, 64);
        for (b, p) in [(1, 0.5), (2, 2.0), (3, 0.5), (4, 1.0), (5, 2.0)] {
            q.push(read(b), p).unwrap();
        }
        assert_eq!(drain(&mut q), [2, 5, 4, 1, 3]);
    }

    #[test]
    fn full_queue_hands_the_read_back() {
        let mut q = ReadQueue::with_capacity(2, 64);
        q.push(read(1), 1.0).unwrap();
        q.push(read(2), 1.0).unwrap();
        assert_eq!(q.push(read(3), 9.0), Err(read(3)));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn set_priority_remove_and_rerank_in_place() {
        let mut q = ReadQueue::with_capacity(16, 64);
        for b in 0..10 {
            q.push(read(b), 1.0 + b as f32).unwrap();
        }
        assert!(q.set_priority(0, 100.0));
        assert!(!q.set_priority(42, 1.0));
        assert_eq!(q.remove(9), Some(read(9)));
        assert_eq!(q.remove(9), None);
        assert_eq!(q.peek().unwrap().0.block, 0);
        // The prediction changed: odd blocks are no longer wanted, even ones reversed.
        let mut prio = [0.0f32; 10];
        for b in (0..10).step_by(2) {
            prio[b] = 10.0 - b as f32;
        }
        let mut gone = Vec::new();
        let n = q.rerank(&prio, |r| gone.push(r.block));
        gone.sort();
        assert_eq!((n, gone), (4, vec![1, 3, 5, 7]));
        assert_eq!(drain(&mut q), [0, 2, 4, 6, 8]);
    }

    #[test]
    fn heap_order_holds_under_random_updates() {
        let mut q = ReadQueue::with_capacity(64, 64);
        let mut x = 12345u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for b in 0..64 {
            q.push(read(b), (rnd() % 100) as f32).unwrap();
        }
        for _ in 0..200 {
            let b = (rnd() % 64) as BlockId;
            q.set_priority(b, (rnd() % 100) as f32);
        }
        for b in 0..16 {
            q.remove(b * 3);
        }
        for b in 0..64 {
            let queued = q.heap.iter().any(|e| e.read.block == b);
            assert_eq!(q.get(b), queued.then(|| read(b)), "block {b}");
        }
        let mut last = f32::INFINITY;
        while let Some((_, p)) = q.pop() {
            assert!(p <= last);
            last = p;
        }
        assert!((0..64).all(|b| q.get(b).is_none()));
    }
}
