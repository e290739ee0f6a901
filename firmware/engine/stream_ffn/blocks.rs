//! The streamed FFN's block bookkeeping: which blocks a layer asked for (recorded for the
//! bench), pins held until the layer is done, and reads handed out by the lanes.

use super::*;

impl StreamedFfn<'_> {
    /// Records layer `l`'s wanted blocks (those of priority above 0), highest priority first
    /// (ties by block), when recording: a replay asks for them in that order again.
    pub(super) fn record(&mut self, l: usize) {
        if let Some(rec) = self.recorded.as_mut() {
            let base = self.base[l];
            let prio = &self.prio[..self.image.blocks(l)];
            let mut wanted: Vec<usize> = (0..prio.len()).filter(|&b| prio[b] > 0.0).collect();
            wanted.sort_by(|&a, &b| prio[b].total_cmp(&prio[a]).then(a.cmp(&b)));
            rec.push(wanted.into_iter().map(|b| base + b as BlockId).collect());
        }
    }

    /// Pins layer `l`'s block `b` until the layer is done (once per layer).
    pub(super) fn hold(&mut self, l: usize, b: usize, pinned_n: &mut usize) {
        if self.mark[b] != HELD {
            self.mark[b] = HELD;
            let id = self.block_id(l, b);
            self.cache.pin(id);
            self.pinned[*pinned_n] = id;
            *pinned_n += 1;
        }
    }

    /// One finished read (`a` from the lanes): a block this layer needs is pinned and its runs
    /// told; a failed one is remembered. With `count`, the pending runs are updated. False when
    /// nothing was in flight.
    pub(super) fn arrived(
        &mut self,
        l: usize,
        a: std::io::Result<Option<crate::stream::Arrival>>,
        pinned_n: &mut usize,
        count: bool,
    ) -> bool {
        let a = match a {
            Ok(Some(a)) => a,
            Ok(None) => return false,
            Err(e) => {
                // The ring itself failed: the reads still out are lost, and the request ends.
                self.error.get_or_insert(ReadError {
                    block: self.base[l],
                    file: self.file,
                    offset: 0,
                    len: 0,
                    attempts: 1,
                    kind: ReadErrorKind::Io(e.raw_os_error().unwrap_or(nix::libc::EIO)),
                });
                return false;
            }
        };
        let (lo, hi) = (self.base[l], self.base[l + 1]);
        if a.block < lo || a.block >= hi {
            return true;
        }
        let b = (a.block - lo) as usize;
        // Runs wait only for blocks counted as missing (a read that finished before the layer
        // asked for its block was a hit, though its arrival is handed out only now).
        let counted = count && self.mark[b] == PENDING;
        let mut needed = false;
        for &n in self.image.block_neurons(l, b) {
            let p = self.pos_of[n as usize];
            if p != NONE {
                needed = true;
                if counted {
                    self.pending[p as usize / ROWS_PER_TASK] -= 1;
                }
            }
        }
        match a.result {
            Ok(_) if needed => self.hold(l, b, pinned_n),
            Ok(_) => {}
            // A block no run needs (a stale guess) may fail without ending the request.
            Err(_) if !needed => {}
            Err(e) => {
                if counted {
                    self.mark[b] = UNSEEN;
                }
                self.stats.missed += self
                    .image
                    .block_neurons(l, b)
                    .iter()
                    .filter(|&&n| self.pos_of[n as usize] != NONE)
                    .count() as u64;
                self.error.get_or_insert(e);
            }
        }
        true
    }
}
