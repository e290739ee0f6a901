//! The I/O lanes: block reads queue by priority ([`ReadQueue`]), leave highest first into `lanes`
//! lanes of at most `queue_depth` reads in flight each, each into its own staging buffer carved
//! from the I/O staging arena (O_DIRECT: buffers, offsets and lengths on `block_align`), and on
//! completion are copied into the weight cache, whose flag for the block is set only after the
//! copy ([`WeightCache::insert`]). Each finished read, good or failed for good, becomes one
//! [`Arrival`], handed out in the order reads finish so a caller computes blocks as they come.
//! A block that arrived stays pinned in the cache until its arrival is handed out (so the
//! reads finishing beside it cannot evict it first); the caller pins it if it needs it longer.
//!
//! Queued blocks that lie next to each other in one file leave as one read of up to
//! `merge_blocks` blocks into as many adjacent buffers of a lane: a disk gives far more bytes a
//! second to a few large reads than to many small ones, and each block still arrives on its own.
//!
//! One thread drives the lanes (the engine's I/O thread); other threads watch the flags. A read
//! that fails (an errno, a short read, nothing past a truncated file's end) is retried on its
//! buffers up to `retries` more times, then ends with a [`ReadError`] for each block it did not
//! bring in whole.
//!
//! Nothing is allocated after [`Lanes::new`] and [`Lanes::open`].

use super::backend::{best_backend, open_direct, Completion, ReadBackend, Submission};
use super::queue::ReadQueue;
use super::{
    BlockId, BlockRead, FileId, ReadError, ReadErrorKind, RequestError, StreamError, WeightCache,
};
use crate::board;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// How many lanes, how deep, how large a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneConfig {
    pub lanes: usize,
    /// Reads in flight per lane.
    pub queue_depth: usize,
    /// The largest block read (a staging buffer's size before alignment).
    pub block_bytes: usize,
    /// O_DIRECT alignment of buffers, offsets and lengths.
    pub align: usize,
    /// Attempts after the first before a read fails for good.
    pub retries: u32,
    /// Reads that may wait in the queue.
    pub queue_capacity: usize,
    /// Adjacent queued blocks one read may cover (1: a read a block); at most `queue_depth`.
    pub merge_blocks: usize,
}

/// Open files the lanes hold at most.
pub const MAX_FILES: usize = 16;

impl LaneConfig {
    /// The board's lanes, queue depth, alignment and merged-read size; 2 retries; a queue four
    /// times the reads in flight.
    pub fn from_board(block_bytes: usize) -> LaneConfig {
        LaneConfig {
            lanes: board::IO_LANES,
            queue_depth: board::IO_QUEUE_DEPTH,
            block_bytes,
            align: board::IO_BLOCK_ALIGN,
            retries: 2,
            queue_capacity: 4 * board::IO_LANES * board::IO_QUEUE_DEPTH,
            merge_blocks: board::IO_MERGE_BLOCKS,
        }
    }

    /// One staging buffer's bytes.
    pub fn buffer_bytes(&self) -> usize {
        self.block_bytes.div_ceil(self.align.max(1)) * self.align.max(1)
    }

    /// Staging bytes the lanes need: one buffer per read in flight.
    pub fn staging_bytes(&self) -> usize {
        self.lanes * self.queue_depth * self.buffer_bytes()
    }

    /// Reads queued, in flight and finished but not yet handed out, at most.
    pub fn capacity(&self) -> usize {
        self.queue_capacity + self.lanes * self.queue_depth
    }
}

/// What [`Lanes::request`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    /// A hit: the block is in this cache slot (no read).
    Cached(usize),
    /// A miss: the read is queued.
    Queued,
    /// Already queued: its priority is updated.
    Requeued,
    /// Already being read.
    InFlight,
}

/// A read that finished: the block's cache slot, or why it failed for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    pub block: BlockId,
    pub result: Result<usize, ReadError>,
}

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const IN_FLIGHT: u8 = 2;

/// The read on a staging buffer. A merged read's first buffer holds its leader (`span` blocks,
/// the attempts); the buffers after it hold the other blocks (`span` 0).
#[derive(Clone, Copy)]
struct Flight {
    read: BlockRead,
    attempts: u32,
    span: u16,
}

pub struct Lanes<'a> {
    cfg: LaneConfig,
    backend: Box<dyn ReadBackend>,
    staging: &'a mut [u8],
    stride: usize,
    files: Vec<(File, bool)>,
    queue: ReadQueue,
    /// Per block: IDLE, QUEUED or IN_FLIGHT.
    state: Vec<u8>,
    /// Per block: read by `prefetch` and not yet asked for by `request` (its access uncounted).
    ahead: Vec<bool>,
    /// Per staging buffer (lane-major): the read using it.
    flights: Vec<Option<Flight>>,
    /// Per lane, `words` u64s: bit k set when the lane's buffer k is free.
    free: Vec<u64>,
    words: usize,
    /// Per lane: its free buffers.
    free_count: Vec<usize>,
    arrivals: Vec<Arrival>,
    arrivals_head: usize,
    arrivals_len: usize,
    done: Vec<Completion>,
    /// Queued + in flight + arrivals not yet handed out.
    outstanding: usize,
    /// Reads on a staging buffer now.
    in_flight: usize,
    /// The controller's caps (`set_limits`): lanes that take new reads, and reads in flight
    /// per lane; at most the config's.
    lanes_in_use: usize,
    depth_in_use: usize,
}

impl<'a> Lanes<'a> {
    /// Lanes over io_uring where this kernel allows it, else pread (said once).
    pub fn with_best_backend(
        cfg: LaneConfig,
        staging: &'a mut [u8],
        blocks: usize,
    ) -> Result<Lanes<'a>, StreamError> {
        let backend = best_backend(cfg.lanes, cfg.queue_depth);
        Lanes::new(cfg, staging, blocks, backend)
    }

    /// Lanes for blocks `0..blocks`, their buffers carved from `staging` (from
    /// `boot::Arenas::io_staging`: page-aligned), reading through `backend`.
    pub fn new(
        cfg: LaneConfig,
        staging: &'a mut [u8],
        blocks: usize,
        mut backend: Box<dyn ReadBackend>,
    ) -> Result<Lanes<'a>, StreamError> {
        if cfg.lanes == 0 || cfg.queue_depth == 0 || cfg.block_bytes == 0 {
            return Err(StreamError::Config(
                "lanes, queue depth and block size must be at least 1",
            ));
        }
        if cfg.queue_depth > u16::MAX as usize || cfg.lanes > u32::MAX as usize {
            return Err(StreamError::Config("the queue depth must be below 65536"));
        }
        if cfg.merge_blocks == 0 || cfg.merge_blocks > cfg.queue_depth {
            return Err(StreamError::Config(
                "a merged read covers 1 to queue-depth blocks (a lane's buffers)",
            ));
        }
        if !cfg.align.is_power_of_two() || !(staging.as_ptr() as usize).is_multiple_of(cfg.align) {
            return Err(StreamError::Config(
                "the staging buffers must start on the (power-of-two) O_DIRECT alignment",
            ));
        }
        let needed = cfg.staging_bytes();
        if needed > staging.len() {
            return Err(StreamError::Staging {
                needed,
                available: staging.len(),
            });
        }
        let stride = cfg.buffer_bytes();
        let staging = &mut staging[..needed];
        let base = staging.as_mut_ptr();
        let lane_bytes = cfg.queue_depth * stride;
        for lane in 0..cfg.lanes {
            // One registered buffer a lane: a merged read spans several of its buffers.
            // SAFETY: in bounds: (lane + 1) * depth * stride <= needed.
            let p = unsafe { base.add(lane * lane_bytes) };
            backend
                .register_buffers(lane, &[(p, lane_bytes)])
                .map_err(StreamError::Backend)?;
        }
        let in_flight = cfg.lanes * cfg.queue_depth;
        let words = cfg.queue_depth.div_ceil(64);
        let mut free = vec![0u64; cfg.lanes * words];
        for lane in 0..cfg.lanes {
            for k in 0..cfg.queue_depth {
                free[lane * words + k / 64] |= 1 << (k % 64);
            }
        }
        Ok(Lanes {
            cfg,
            backend,
            staging,
            stride,
            files: Vec::with_capacity(MAX_FILES),
            queue: ReadQueue::with_capacity(cfg.queue_capacity, blocks),
            state: vec![IDLE; blocks],
            ahead: vec![false; blocks],
            flights: vec![None; in_flight],
            free,
            words,
            free_count: vec![cfg.queue_depth; cfg.lanes],
            arrivals: vec![
                Arrival {
                    block: 0,
                    result: Ok(0)
                };
                cfg.capacity()
            ],
            arrivals_head: 0,
            arrivals_len: 0,
            done: vec![Completion { tag: 0, result: 0 }; in_flight],
            outstanding: 0,
            in_flight: 0,
            lanes_in_use: cfg.lanes,
            depth_in_use: cfg.queue_depth,
        })
    }

    /// Opens a file to read blocks from, with O_DIRECT where its filesystem allows.
    pub fn open(&mut self, path: &Path) -> Result<FileId, StreamError> {
        if self.files.len() == MAX_FILES {
            return Err(StreamError::TooManyFiles { max: MAX_FILES });
        }
        let (f, direct) = open_direct(path).map_err(|source| StreamError::Open {
            path: path.display().to_string(),
            source,
        })?;
        self.files.push((f, direct));
        Ok(FileId((self.files.len() - 1) as u16))
    }

    /// Whether `file` bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self, file: FileId) -> bool {
        self.files[file.0 as usize].1
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub fn config(&self) -> LaneConfig {
        self.cfg
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Reads queued, in flight, or finished and not yet handed out.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// The token needs `read.block` at `priority` (higher is sooner): a hit, or its read queued
    /// (the cache counts the hit or miss). A block already queued takes the new priority.
    pub fn request(
        &mut self,
        read: BlockRead,
        priority: f32,
        cache: &mut WeightCache,
    ) -> Result<Requested, RequestError> {
        self.enqueue(read, priority, cache, false)
    }

    /// Reads `read.block` ahead of the layer that will ask for it (speculate-and-refine): as
    /// [`request`](Self::request), but the cache counts nothing yet. The layer's own `request`
    /// counts the access: a hit if the read is in by then, else a miss.
    pub fn prefetch(
        &mut self,
        read: BlockRead,
        priority: f32,
        cache: &mut WeightCache,
    ) -> Result<Requested, RequestError> {
        self.enqueue(read, priority, cache, true)
    }

    /// A block read ahead and not yet asked for is now asked for while its read is still out:
    /// the access counts as a miss.
    fn count_ahead(&mut self, block: BlockId, cache: &mut WeightCache) {
        if std::mem::take(&mut self.ahead[block as usize]) {
            cache.lookup(block);
        }
    }

    fn enqueue(
        &mut self,
        read: BlockRead,
        priority: f32,
        cache: &mut WeightCache,
        ahead: bool,
    ) -> Result<Requested, RequestError> {
        let block = read.block;
        let blocks = self.state.len().min(cache.blocks());
        if block as usize >= blocks {
            return Err(RequestError::NoSuchBlock { block, blocks });
        }
        match self.state[block as usize] {
            QUEUED => {
                self.queue.set_priority(block, priority);
                if !ahead {
                    self.count_ahead(block, cache);
                }
                return Ok(Requested::Requeued);
            }
            IN_FLIGHT => {
                if !ahead {
                    self.count_ahead(block, cache);
                }
                return Ok(Requested::InFlight);
            }
            _ => {}
        }
        let Some((_, direct)) = self.files.get(read.file.0 as usize) else {
            return Err(RequestError::NoSuchFile { file: read.file });
        };
        let max = self.stride.min(cache.slot_bytes());
        if read.len as usize > max || read.len == 0 {
            return Err(RequestError::TooLong {
                block,
                len: read.len,
                max,
            });
        }
        let a = self.cfg.align as u64;
        if *direct && (!read.offset.is_multiple_of(a) || !(read.len as u64).is_multiple_of(a)) {
            return Err(RequestError::Misaligned {
                block,
                align: self.cfg.align,
            });
        }
        if let Some(slot) = cache.slot_of(block) {
            if ahead {
                return Ok(Requested::Cached(slot));
            }
            self.ahead[block as usize] = false;
            let slot = cache.lookup(block).expect("cached");
            return Ok(Requested::Cached(slot));
        }
        if self.queue.len() == self.queue.capacity() {
            return Err(RequestError::Full {
                limit: self.queue.capacity(),
            });
        }
        if self.outstanding == self.cfg.capacity() {
            return Err(RequestError::Full {
                limit: self.cfg.capacity(),
            });
        }
        if !ahead {
            cache.lookup(block);
        }
        self.ahead[block as usize] = ahead;
        cache.clear_failed(block);
        self.queue.push(read, priority).expect("room checked");
        self.state[block as usize] = QUEUED;
        self.outstanding += 1;
        cache.note_queue_depth(self.queue.len() + self.in_flight());
        Ok(Requested::Queued)
    }

    /// Re-ranks a queued read; false when it is not queued (in flight or done).
    pub fn set_priority(&mut self, block: BlockId, priority: f32) -> bool {
        self.queue.set_priority(block, priority)
    }

    /// Drops a queued read; false when it is not queued.
    pub fn cancel(&mut self, block: BlockId) -> bool {
        if self.queue.remove(block).is_some() {
            self.state[block as usize] = IDLE;
            self.ahead[block as usize] = false;
            self.outstanding -= 1;
            true
        } else {
            false
        }
    }

    /// Re-ranks every queued read from `priorities[block]`, dropping those no longer above 0
    /// (the prediction changed); how many were dropped. Reads in flight go on.
    pub fn rerank(&mut self, priorities: &[f32]) -> usize {
        let (state, ahead) = (&mut self.state, &mut self.ahead);
        let n = self.queue.rerank(priorities, |r| {
            state[r.block as usize] = IDLE;
            ahead[r.block as usize] = false;
        });
        self.outstanding -= n;
        n
    }

    /// Submits what the lanes have room for and takes in what finished, without waiting; the
    /// next finished read, if any.
    pub fn poll(&mut self, cache: &mut WeightCache) -> io::Result<Option<Arrival>> {
        if let Some(a) = self.pop_arrival(cache) {
            return Ok(Some(a));
        }
        self.submit_ready(cache)?;
        self.reap(cache, false)?;
        self.submit_ready(cache)?;
        Ok(self.pop_arrival(cache))
    }

    /// The next finished read, waiting for one; `None` when no read is queued or in flight.
    pub fn wait_next(&mut self, cache: &mut WeightCache) -> io::Result<Option<Arrival>> {
        loop {
            if let Some(a) = self.pop_arrival(cache) {
                return Ok(Some(a));
            }
            self.submit_ready(cache)?;
            if self.in_flight() == 0 {
                return Ok(None);
            }
            self.reap(cache, true)?;
        }
    }

    /// The next finished read, handed out: a block that arrived whole loses the pin that kept
    /// it from eviction while it waited in the ring (the caller pins it if it needs it).
    fn pop_arrival(&mut self, cache: &mut WeightCache) -> Option<Arrival> {
        if self.arrivals_len == 0 {
            return None;
        }
        let a = self.arrivals[self.arrivals_head];
        if a.result.is_ok() {
            cache.unpin(a.block);
        }
        self.arrivals_head = (self.arrivals_head + 1) % self.arrivals.len();
        self.arrivals_len -= 1;
        self.outstanding -= 1;
        Some(a)
    }

    fn push_arrival(&mut self, a: Arrival) {
        let n = self.arrivals.len();
        assert!(self.arrivals_len < n, "arrival ring overflow");
        self.arrivals[(self.arrivals_head + self.arrivals_len) % n] = a;
        self.arrivals_len += 1;
    }

    /// Caps the lanes that take new reads and the reads in flight on each (the controller's
    /// plan), within the config's; reads already in flight finish where they are.
    pub fn set_limits(&mut self, lanes: usize, queue_depth: usize) {
        self.lanes_in_use = lanes.clamp(1, self.cfg.lanes);
        self.depth_in_use = queue_depth.clamp(1, self.cfg.queue_depth);
    }

    /// The caps in force: (lanes, reads in flight per lane).
    pub fn limits(&self) -> (usize, usize) {
        (self.lanes_in_use, self.depth_in_use)
    }

    /// Moves queued reads, highest first, onto the least busy lanes with a free buffer, within
    /// the caps of `set_limits`.
    fn submit_ready(&mut self, cache: &mut WeightCache) -> io::Result<()> {
        let mut any = false;
        // A lane with fewer than `floor` free buffers has `depth_in_use` reads in flight.
        let floor = self.cfg.queue_depth - self.depth_in_use;
        while !self.queue.is_empty() {
            let Some(lane) = (0..self.lanes_in_use)
                .filter(|&l| self.free_count[l] > floor)
                .max_by_key(|&l| self.free_count[l])
            else {
                break;
            };
            let (read, _) = self.queue.pop().expect("not empty");
            let (k, run) = self.free_run(lane, self.free_count[lane] - floor);
            let idx = lane * self.cfg.queue_depth + k;
            let mut span = 1;
            self.take_buffer(idx, read);
            // The blocks after it, queued and next to it in the file, ride along.
            while span < run {
                let next = read.block.wrapping_add(span as u32);
                let Some(r) = self.queue.get(next) else {
                    break;
                };
                if r.file != read.file || r.offset != read.offset + (span * self.stride) as u64 {
                    break;
                }
                self.queue.remove(next);
                self.take_buffer(idx + span, r);
                span += 1;
            }
            self.flights[idx].as_mut().expect("leader").span = span as u16;
            self.start(idx, cache);
            any = true;
        }
        if any {
            self.backend.flush()?;
        }
        Ok(())
    }

    /// The first free buffer of `lane` and how many free buffers follow it in a row (itself
    /// included), at most `max` and `merge_blocks`.
    fn free_run(&self, lane: usize, max: usize) -> (usize, usize) {
        let words = &self.free[lane * self.words..(lane + 1) * self.words];
        let is_free = |k: usize| words[k / 64] & (1 << (k % 64)) != 0;
        let w = words.iter().position(|&w| w != 0).expect("a free buffer");
        let k = w * 64 + words[w].trailing_zeros() as usize;
        let cap = max.min(self.cfg.merge_blocks);
        let mut run = 1;
        while run < cap && k + run < self.cfg.queue_depth && is_free(k + run) {
            run += 1;
        }
        (k, run)
    }

    /// Puts `read` on staging buffer `idx` (free), as a block of a read about to start.
    fn take_buffer(&mut self, idx: usize, read: BlockRead) {
        let (lane, k) = (idx / self.cfg.queue_depth, idx % self.cfg.queue_depth);
        self.free[lane * self.words + k / 64] &= !(1 << (k % 64));
        self.free_count[lane] -= 1;
        self.flights[idx] = Some(Flight {
            read,
            attempts: 0,
            span: 0,
        });
        self.in_flight += 1;
        self.state[read.block as usize] = IN_FLIGHT;
    }

    /// Gives staging buffer `idx` back to its lane.
    fn free_buffer(&mut self, idx: usize) {
        let (lane, k) = (idx / self.cfg.queue_depth, idx % self.cfg.queue_depth);
        self.flights[idx] = None;
        self.free[lane * self.words + k / 64] |= 1 << (k % 64);
        self.free_count[lane] += 1;
        self.in_flight -= 1;
    }

    /// Starts (another) attempt of the read led from staging buffer `idx`.
    fn start(&mut self, idx: usize, cache: &mut WeightCache) {
        let depth = self.cfg.queue_depth;
        let f = self.flights[idx].as_mut().expect("read on buffer");
        f.attempts += 1;
        let (read, span) = (f.read, f.span as usize);
        let last = self.flights[idx + span - 1]
            .expect("block of the read")
            .read;
        let sub = Submission {
            tag: idx as u64,
            lane: idx / depth,
            fd: self.files[read.file.0 as usize].0.as_raw_fd(),
            offset: read.offset,
            len: ((span - 1) * self.stride) as u32 + last.len,
            // SAFETY: idx + span <= (lane + 1) * depth (the buffers of one lane), so the read's
            // bytes lie within `staging`.
            buf: unsafe { self.staging.as_mut_ptr().add(idx * self.stride) },
            buf_index: 0,
            block: read.block,
            blocks: span as u16,
            block_stride: self.stride as u32,
        };
        if let Err(e) = self.backend.submit(sub) {
            // Counted as a failed attempt of this read, not of the lanes.
            let errno = e.raw_os_error().unwrap_or(nix::libc::EIO);
            self.finish(idx, -errno, cache);
        }
    }

    fn reap(&mut self, cache: &mut WeightCache, wait: bool) -> io::Result<()> {
        let n = self.backend.reap(&mut self.done, wait)?;
        for k in 0..n {
            let c = self.done[k];
            self.finish(c.tag as usize, c.result, cache);
        }
        if n > 0 {
            self.backend.flush()?;
        }
        Ok(())
    }

    /// One attempt of the read led from buffer `idx` returned `result` (bytes, or -errno). Each
    /// block it brought in whole arrives; each other one is tried again on its own (a bad block
    /// must not take its neighbours down) until the retries are spent, then fails.
    fn finish(&mut self, idx: usize, result: i32, cache: &mut WeightCache) {
        let lead = self.flights[idx].expect("completion for an idle buffer");
        let retry = lead.attempts <= self.cfg.retries;
        for j in 0..lead.span as usize {
            let f = self.flights[idx + j].expect("block of the read");
            // What came back of block j (at j * stride in the read).
            let got = result as i64 - (j * self.stride) as i64;
            let kind = if result < 0 {
                Some(ReadErrorKind::Io(-result))
            } else if got <= 0 {
                Some(ReadErrorKind::PastEnd)
            } else if got < f.read.len as i64 {
                Some(ReadErrorKind::Short { got: got as u32 })
            } else {
                None
            };
            match kind {
                Some(_) if retry => {
                    self.flights[idx + j] = Some(Flight {
                        read: f.read,
                        attempts: lead.attempts,
                        span: 1,
                    });
                    self.start(idx + j, cache);
                }
                _ => self.complete(idx + j, kind, lead.attempts, cache),
            }
        }
    }

    /// The block on buffer `idx` is done: in the cache (pinned until handed out) unless `failed`
    /// says why not; its arrival is queued and its buffer freed.
    fn complete(
        &mut self,
        idx: usize,
        failed: Option<ReadErrorKind>,
        attempts: u32,
        cache: &mut WeightCache,
    ) {
        let read = self.flights[idx].expect("block of the read").read;
        let outcome = match failed {
            None => {
                let start = idx * self.stride;
                let bytes = &self.staging[start..start + read.len as usize];
                // Pinned until handed out: a later completion of the same reap must not evict a
                // block whose arrival nobody has seen yet.
                match cache.insert(read.block, bytes) {
                    Some(slot) => {
                        cache.pin(read.block);
                        Ok(slot)
                    }
                    None => Err(ReadErrorKind::NoSlot),
                }
            }
            Some(k) => Err(k),
        };
        let result = outcome.map_err(|kind| {
            cache.mark_failed(read.block);
            ReadError {
                block: read.block,
                file: read.file,
                offset: read.offset,
                len: read.len,
                attempts,
                kind,
            }
        });
        self.free_buffer(idx);
        self.state[read.block as usize] = IDLE;
        self.push_arrival(Arrival {
            block: read.block,
            result,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::Arenas;

    #[test]
    fn the_boards_lanes_fit_its_staging_arena() {
        let cfg = LaneConfig::from_board(64 * 1024);
        assert_eq!(
            (cfg.lanes, cfg.queue_depth, cfg.align),
            (
                board::IO_LANES,
                board::IO_QUEUE_DEPTH,
                board::IO_BLOCK_ALIGN
            )
        );
        let mut arenas = Arenas::from_board().unwrap();
        let staging = arenas.io_staging.carver().take::<u8>(cfg.staging_bytes());
        let staging = staging.expect("the host board's io_staging holds its lanes' buffers");
        let lanes = Lanes::with_best_backend(cfg, staging, 16).unwrap();
        assert!(["io_uring", "pread"].contains(&lanes.backend_name()));
        assert_eq!(
            (lanes.queued(), lanes.in_flight(), lanes.outstanding()),
            (0, 0, 0)
        );
    }
}
