//! Shared by the stream tests: a block file on the repository's filesystem (so O_DIRECT is what
//! the product gets), arenas sized for small lanes and caches, and the backends to run under.
#![allow(dead_code)]

use leanstream::boot::{Arena, ArenaKind};
use leanstream::stream::backend::{PreadBackend, ReadBackend, UringBackend};
use leanstream::stream::{flags_from_words, BlockId, LaneConfig, Policy, WeightCache};
use std::io::Write;
use std::path::PathBuf;

pub const BLOCK: usize = 4096;

/// Block `b`'s bytes: its id then a pattern that differs per block and per byte.
pub fn block_bytes(b: BlockId) -> Vec<u8> {
    let mut v: Vec<u8> = (0..BLOCK)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(b.wrapping_mul(97)) as u8)
        .collect();
    v[..4].copy_from_slice(&b.to_le_bytes());
    v
}

/// A file of `blocks` blocks of 4 KiB under the target directory (the repository's filesystem).
pub fn block_file(blocks: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("blocks.bin");
    let mut f = std::fs::File::create(&path).expect("create");
    for b in 0..blocks {
        f.write_all(&block_bytes(b)).expect("write");
    }
    f.sync_all().expect("sync");
    (dir, path)
}

/// The arenas one rig carves: staging, FFN cache and flags, each mapped from its budget.
pub struct Rig {
    pub staging: Arena,
    pub ffn: Arena,
    pub flags: Arena,
    slots: usize,
    blocks: usize,
    staging_bytes: usize,
}

impl Rig {
    pub fn new(cfg: &LaneConfig, slots: usize, blocks: usize) -> Rig {
        Rig {
            staging: Arena::map(ArenaKind::IoStaging, cfg.staging_bytes()).unwrap(),
            ffn: Arena::map(ArenaKind::FfnCache, slots * BLOCK).unwrap(),
            flags: Arena::map(ArenaKind::Flags, blocks * 4).unwrap(),
            slots,
            blocks,
            staging_bytes: cfg.staging_bytes(),
        }
    }

    /// The rig's cache (all its slots, a flag per block, `policy` pinning `hot`) and the lanes'
    /// staging, carved from its arenas.
    pub fn parts(&mut self, policy: Policy, hot: &[BlockId]) -> (WeightCache<'_>, &mut [u8]) {
        let flags = flags_from_words(self.flags.carver().take::<u32>(self.blocks).unwrap());
        let slots = self.ffn.carver().take::<u8>(self.slots * BLOCK).unwrap();
        let cache = WeightCache::new(slots, BLOCK, self.slots, policy, flags, hot, None).unwrap();
        let staging = self
            .staging
            .carver()
            .take::<u8>(self.staging_bytes)
            .unwrap();
        (cache, staging)
    }
}

/// Small lanes: `lanes` x `depth`, 4 KiB blocks, 2 retries, a read a block.
pub fn config(lanes: usize, depth: usize) -> LaneConfig {
    LaneConfig {
        lanes,
        queue_depth: depth,
        block_bytes: BLOCK,
        align: 4096,
        retries: 2,
        queue_capacity: 256,
        merge_blocks: 1,
    }
}

/// The backends to run a test under: pread always, io_uring where this kernel has it (else a
/// `skipped:` line for that half).
pub fn backends(cfg: &LaneConfig, test: &str) -> Vec<Box<dyn ReadBackend>> {
    let mut v: Vec<Box<dyn ReadBackend>> =
        vec![Box::new(PreadBackend::new(cfg.lanes * cfg.queue_depth))];
    match UringBackend::new(cfg.lanes, cfg.queue_depth) {
        Ok(u) => v.push(Box::new(u)),
        Err(e) => eprintln!("skipped: io_uring not available ({e}): {test} ran on pread only"),
    }
    v
}
