//! What a streamed FFN runs on, whichever backend computes it (the CPU's runs here, the GPU's
//! persistent kernel in `engine::cuda`): the image's block numbering, the I/O lanes, the weight
//! cache and the predictor, made once at boot from the board's arenas.

use super::*;

/// The parts of a streamed FFN that do not depend on where it is computed.
pub struct StreamParts<'a> {
    pub image: FlashImage,
    pub file: FileId,
    pub lanes: Lanes<'a>,
    pub cache: WeightCache<'a>,
    pub predictor: BlockPredictor<'a>,
    /// Layer l's blocks are global ids `base[l]..base[l + 1]`.
    pub base: Vec<u32>,
    /// Blocks of the largest layer.
    pub largest: usize,
}

impl<'a> StreamParts<'a> {
    /// The parts for `image` under `opts`: the cache in `ffn` (whose length is the budget the
    /// board gives it), one flag per block in `flags`, the lanes' buffers in `staging`, the
    /// predictor's buffers from `scratch`. Refuses a cache smaller than the largest layer plus
    /// the reads in flight plus the hot blocks.
    pub fn boot(
        image: FlashImage,
        opts: &StreamOptions,
        ffn: &'a mut [u8],
        flags: &'a mut [u32],
        staging: &'a mut [u8],
        scratch: &mut Carver<'a>,
    ) -> Result<StreamParts<'a>, StreamBootError> {
        let layers = image.layers();
        let mut base = Vec::with_capacity(layers + 1);
        let mut total = 0u32;
        for l in 0..layers {
            base.push(total);
            total += image.blocks(l) as u32;
        }
        base.push(total);
        let total = total as usize;
        if flags.len() < total {
            return Err(StreamError::Flags {
                blocks: total,
                flags: flags.len(),
            }
            .into());
        }
        let flags = flags_from_words(&mut flags[..total]);
        let (slots, slot_bytes) = StreamedFfn::slots(&image, opts.budget);
        let largest = max_blocks(&image);
        let mut cfg = LaneConfig::from_board(slot_bytes);
        if let Some(m) = opts.merge_blocks {
            cfg.merge_blocks = m;
        }
        let in_flight = cfg.lanes * cfg.queue_depth;
        // Pinned at once, at most: a whole layer, each read finished but not yet handed out,
        // and the hot set; every other slot can be evicted.
        let busy = largest + in_flight;
        // Too small for any policy: said before the hot set is looked for, which a budget
        // this small would leave empty (and ask a profile of an image that needs none).
        if slots < busy {
            return Err(StreamBootError::TooSmall {
                slots,
                largest,
                in_flight,
                hot: 0,
            });
        }
        let hot = match opts.policy {
            Policy::Hot if opts.hot.is_empty() => {
                let freq = image.block_frequency().ok_or(StreamBootError::NoProfile)?;
                most_used(&freq[..total], hot_count(slots, busy))
            }
            Policy::Hot => opts.hot.clone(),
            _ => Vec::new(),
        };
        let hot_n = hot.len();
        if slots < busy + hot_n {
            return Err(StreamBootError::TooSmall {
                slots,
                largest,
                in_flight,
                hot: hot_n,
            });
        }
        let reuse = match (&opts.eviction, opts.policy) {
            (Some(path), Policy::Learned) => Some(std::sync::Arc::new(
                ReuseTable::read(path, image.header.tables_identity).map_err(|error| {
                    PredictorBootError::Eviction {
                        path: path.clone(),
                        error,
                    }
                })?,
            )),
            _ => None,
        };
        let cache = WeightCache::new(ffn, slot_bytes, slots, opts.policy, flags, &hot, reuse)?;
        let inner = best_backend(cfg.lanes, cfg.queue_depth);
        let backend: Box<dyn crate::stream::backend::ReadBackend> =
            if opts.faults.is_empty() && opts.shuffle.is_none() {
                inner
            } else {
                let mut f = FaultBackend::new(inner, total, in_flight);
                for &fault in &opts.faults {
                    f = f.with_fault(fault);
                }
                if let Some(seed) = opts.shuffle {
                    f = f.shuffled(seed);
                }
                Box::new(f)
            };
        let mut lanes = Lanes::new(cfg, staging, total, backend)?;
        let file = lanes.open(&opts.image)?;
        let predictor = match &opts.replay {
            Some(steps) => BlockPredictor::Replay {
                steps: steps.clone(),
                calls: vec![0; layers],
            },
            None => BlockPredictor::new(
                opts.predict,
                opts.predictor.as_deref(),
                &image,
                largest,
                scratch,
            )?,
        };
        Ok(StreamParts {
            image,
            file,
            lanes,
            cache,
            predictor,
            base,
            largest,
        })
    }
}

/// How many blocks the `hot` policy pins in `slots` when `busy` must stay free (a whole layer and
/// the reads in flight): half the slots at most.
pub fn hot_count(slots: usize, busy: usize) -> usize {
    (slots / 2).min(slots.saturating_sub(busy))
}

/// The `n` blocks used most by `freq` (one count per global block), most used first, ties by
/// block: the `hot` policy's pinned set from a profile.
pub fn most_used(freq: &[u32], n: usize) -> Vec<BlockId> {
    let mut order: Vec<BlockId> = (0..freq.len() as BlockId).collect();
    order.sort_by_key(|&b| std::cmp::Reverse(freq[b as usize]));
    order.truncate(n);
    order
}

/// The oracle's resident gate and up rows, gathered from the image into neuron order, and per
/// layer where its gate and up rows start (a learned predictor needs none: what it reads is
/// computed from the rows read).
pub fn resident_rows(image: &FlashImage) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut resident = Vec::new();
    let mut resident_at = Vec::with_capacity(image.layers());
    for l in 0..image.layers() {
        let g = *image.geometry(l);
        let (gb, ub, _) = g.part_bytes().expect("checked geometry");
        let n = g.neurons as usize;
        let at = resident.len();
        resident.resize(at + n * (gb + ub), 0);
        for j in 0..n {
            let (b, i) = image.slot_of(l, j);
            let rows = image.block_rows(l, b);
            resident[at + j * gb..][..gb].copy_from_slice(rows.gate.row(i));
            resident[at + n * gb + j * ub..][..ub].copy_from_slice(rows.up.row(i));
        }
        resident_at.push((at, at + n * gb));
    }
    (resident, resident_at)
}
