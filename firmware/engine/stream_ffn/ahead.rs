//! The next layer's reads queued ahead (speculate-and-refine, LeanStream paper 2.1): the
//! guesses a table reading the residual after the previous FFN makes for layer l + 1 while
//! layer l runs, and what of them is queued. The CPU's streamed FFN and the GPU's decoder
//! share it, so both queue, re-rank and drop the same way.

use crate::boot::{BootError, Carver};
use crate::model::flash::FlashImage;
use crate::stream::{BlockRead, FileId, Lanes, RequestError, Requested, WeightCache};

pub struct ReadAhead<'a> {
    /// The layer whose reads were queued ahead, and whether `queued` holds its last guess
    /// (made from the whole residual its table reads: its own prediction).
    layer: Option<usize>,
    last: bool,
    /// That layer's priorities per block as queued.
    queued: &'a mut [f32],
    /// The next guess, per block (the predictor writes it; [`ReadAhead::submit`] queues it).
    pub guess: &'a mut [f32],
}

impl<'a> ReadAhead<'a> {
    /// Room for a layer of `largest` blocks, from `scratch`.
    pub fn new(scratch: &mut Carver<'a>, largest: usize) -> Result<ReadAhead<'a>, BootError> {
        Ok(ReadAhead {
            layer: None,
            last: false,
            queued: scratch.take(largest)?,
            guess: scratch.take(largest)?,
        })
    }

    /// A new sequence, or a layer that chose its own blocks: no guess stands.
    pub fn forget(&mut self) {
        self.layer = None;
        self.last = false;
    }

    /// Layer `l`'s priorities into `prio` when its last guess was made from the very input
    /// its table reads (so it is the layer's own prediction); false otherwise.
    pub fn take_last(&mut self, l: usize, prio: &mut [f32]) -> bool {
        let hit = self.layer == Some(l) && self.last;
        if hit {
            prio.copy_from_slice(&self.queued[..prio.len()]);
        }
        hit
    }

    /// Queues layer `l`'s reads (global ids from `base`) from `guess[..blocks(l)]`; `last`:
    /// the guess is made from the whole input. Reads it now wants are asked for at their
    /// priority (nothing counted until the layer asks), queued reads it no longer wants are
    /// dropped (reads already in flight finish into the cache). The lanes start them at their
    /// next poll ([`ReadAhead::start`]). Returns the reads queued.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        l: usize,
        last: bool,
        image: &FlashImage,
        file: FileId,
        base: u32,
        lanes: &mut Lanes,
        cache: &mut WeightCache,
    ) -> u64 {
        let n = image.blocks(l);
        if self.layer != Some(l) {
            self.queued[..n].fill(0.0);
        }
        let mut queued = 0;
        for b in 0..n {
            let (new, old) = (self.guess[b], self.queued[b]);
            if new > 0.0 {
                let (offset, len) = image.block_extent(l, b);
                let read = BlockRead {
                    file,
                    offset,
                    len: len as u32,
                    block: base + b as u32,
                };
                match lanes.prefetch(read, new, cache) {
                    Ok(Requested::Queued) => queued += 1,
                    Ok(_) => {}
                    // No room: the layer asks for the rest itself.
                    Err(RequestError::Full { .. }) => {}
                    Err(e) => panic!("a checked image's block read was refused: {e}"),
                }
            } else if old > 0.0 {
                lanes.cancel(base + b as u32);
            }
            self.queued[b] = new;
        }
        self.layer = Some(l);
        self.last = last;
        queued
    }

    /// Starts what the lanes have room for, taking in what has arrived: arrivals stay cached,
    /// unpinned, until their layer asks for them. Only where no layer is waiting for an
    /// arrival (one taken in here would never reach it). A failed read here is asked for again
    /// by its layer; a failed ring fails there too.
    pub fn start(lanes: &mut Lanes, cache: &mut WeightCache) {
        while let Ok(Some(_)) = lanes.poll(cache) {}
    }
}
