//! Fault injection for the lanes' tests: wraps a real backend and, on chosen reads, returns EIO,
//! cuts a read short, returns nothing (as past a truncated file's end), holds a completion back
//! for a number of reaps, or hands completions back in a seeded random order. Everything is
//! sized at construction, so the no-allocation test can run through it.

use super::backend::{Completion, ReadBackend, Submission};
use std::io;

/// What happens to a faulted read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The kernel's EIO, without reading.
    Eio,
    /// At most this many bytes come back.
    Short(u32),
    /// No bytes come back (the file ends before the block).
    PastEnd,
    /// The completion is held back for this many reaps.
    Delay(u32),
}

/// A fault on block `block`'s first `attempts` read attempts (`u32::MAX`: every attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub block: u32,
    pub attempts: u32,
    pub kind: FaultKind,
}

#[derive(Clone, Copy)]
struct Held {
    c: Completion,
    /// Reaps still to wait before release.
    hold: u32,
}

pub struct FaultBackend {
    inner: Box<dyn ReadBackend>,
    faults: Vec<Fault>,
    /// Read attempts per block so far.
    attempts: Vec<u32>,
    /// Per in-flight tag: the effect to apply on completion.
    effects: Vec<(u64, FaultKind)>,
    pool: Vec<Held>,
    scratch: Vec<Completion>,
    shuffle: Option<u64>,
}

impl FaultBackend {
    /// Wraps `inner` for reads of blocks below `blocks`, at most `in_flight` at a time.
    pub fn new(inner: Box<dyn ReadBackend>, blocks: usize, in_flight: usize) -> FaultBackend {
        FaultBackend {
            inner,
            faults: Vec::new(),
            attempts: vec![0; blocks],
            effects: Vec::with_capacity(in_flight),
            pool: Vec::with_capacity(in_flight),
            scratch: vec![Completion { tag: 0, result: 0 }; in_flight.max(1)],
            shuffle: None,
        }
    }

    /// Adds a fault (at construction: the list is not grown later).
    pub fn with_fault(mut self, f: Fault) -> FaultBackend {
        self.faults.push(f);
        self
    }

    /// Hands completions back one per reap, in an order drawn from `seed`.
    pub fn shuffled(mut self, seed: u64) -> FaultBackend {
        self.shuffle = Some(seed | 1);
        self
    }

    /// Read attempts made on `block` so far.
    pub fn attempts(&self, block: u32) -> u32 {
        self.attempts[block as usize]
    }

    fn next_random(&mut self) -> u64 {
        let x = self.shuffle.as_mut().expect("shuffling");
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn pull_inner(&mut self, wait: bool) -> io::Result<()> {
        let n = self.inner.reap(&mut self.scratch, wait)?;
        for k in 0..n {
            let mut c = self.scratch[k];
            let mut hold = 0;
            if let Some(i) = self.effects.iter().position(|e| e.0 == c.tag) {
                match self.effects.swap_remove(i).1 {
                    FaultKind::Short(max) if c.result > 0 => c.result = c.result.min(max as i32),
                    FaultKind::PastEnd if c.result > 0 => c.result = 0,
                    FaultKind::Delay(n) => hold = n,
                    _ => {}
                }
            }
            self.pool.push(Held { c, hold });
        }
        Ok(())
    }
}

impl ReadBackend for FaultBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn register_buffers(&mut self, lane: usize, bufs: &[(*mut u8, usize)]) -> io::Result<()> {
        self.inner.register_buffers(lane, bufs)
    }

    fn submit(&mut self, s: Submission) -> io::Result<()> {
        // A merged read counts an attempt of each block it covers and takes the first fault
        // among them; a short or missing block cuts the read at that block's place in it.
        let (first, blocks) = (s.block, s.blocks.max(1) as u32);
        for b in first..first + blocks {
            self.attempts[b as usize] += 1;
        }
        let attempts = &self.attempts;
        let fault = self
            .faults
            .iter()
            .find(|f| {
                (first..first + blocks).contains(&f.block)
                    && attempts[f.block as usize] <= f.attempts
            })
            .map(|f| {
                let at = (f.block - first) * s.block_stride;
                match f.kind {
                    FaultKind::Short(max) => FaultKind::Short(at + max),
                    FaultKind::PastEnd if at > 0 => FaultKind::Short(at),
                    k => k,
                }
            });
        match fault {
            Some(FaultKind::Eio) => {
                self.pool.push(Held {
                    c: Completion {
                        tag: s.tag,
                        result: -nix::libc::EIO,
                    },
                    hold: 0,
                });
                Ok(())
            }
            Some(kind) => {
                self.effects.push((s.tag, kind));
                self.inner.submit(s)
            }
            None => self.inner.submit(s),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn reap(&mut self, out: &mut [Completion], wait: bool) -> io::Result<usize> {
        // Everything already finished comes into the pool; block only when it holds nothing.
        self.pull_inner(false)?;
        if self.pool.is_empty() {
            self.pull_inner(wait)?;
        }
        if wait && !self.pool.is_empty() && self.pool.iter().all(|h| h.hold > 0) {
            // Nothing else may ever finish: let the delays run out now.
            let least = self.pool.iter().map(|h| h.hold).min().unwrap_or(0);
            for h in &mut self.pool {
                h.hold -= least;
            }
        }
        let limit = if self.shuffle.is_some() { 1 } else { out.len() };
        let mut n = 0;
        while n < limit.min(out.len()) {
            let ready = self.pool.iter().filter(|h| h.hold == 0).count();
            if ready == 0 {
                break;
            }
            let pick = if self.shuffle.is_some() {
                (self.next_random() % ready as u64) as usize
            } else {
                0
            };
            let i = self
                .pool
                .iter()
                .enumerate()
                .filter(|(_, h)| h.hold == 0)
                .nth(pick)
                .map(|(i, _)| i)
                .expect("ready entry");
            out[n] = self.pool.remove(i).c;
            n += 1;
        }
        for h in &mut self.pool {
            h.hold = h.hold.saturating_sub(1);
        }
        Ok(n)
    }
}
