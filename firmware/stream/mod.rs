//! SSD streaming: the I/O lanes that read FFN blocks from disk and the weight cache they land
//! in (paper 3.2.1-3.2.2; DESIGN.md sections 5-6; docs/STREAMING.md).
//!
//! - [`lanes`]: a fixed-capacity priority queue of block reads ([`queue`]) drained into I/O
//!   lanes, each an io_uring ring reading with O_DIRECT into registered buffers carved from the
//!   I/O staging arena ([`backend`]; a plain `pread` backend with the same semantics where
//!   io_uring cannot be set up). Each whole, successful read is copied into its cache slot and
//!   only then its flag is set (Release); failed reads are retried a bounded number of times and
//!   then end with a [`ReadError`].
//! - [`cache`]: the weight cache: fixed slots carved from the FFN-cache arena, policies `lru`,
//!   `lfu` and `hot` (PowerInfer-2: profiled-hot blocks pinned, the rest LFU), counters.
//! - [`sim`]: the same policies and Belady's optimal eviction over recorded per-token block
//!   sets, for miss-ratio figures.
//! - [`fault`]: a backend wrapper that injects EIO, short reads, delays and reordering, so every
//!   failure path runs in the tests.
//!
//! A block read is described by (file, byte offset, byte length, block id) ([`BlockRead`]); the
//! flash image format says where each block lies, the engine connects the two.
//!
//! Nothing here allocates after construction: the queue, the in-flight tables, the arrival
//! ring and the cache's maps are sized once.

pub mod backend;
pub mod cache;
pub mod error;
pub mod fault;
pub mod lanes;
pub mod policy;
pub mod queue;
pub mod sim;

pub use cache::{CacheBudget, CacheStats, WeightCache};
pub use error::{ReadError, ReadErrorKind, RequestError, StreamError};
pub use lanes::{Arrival, LaneConfig, Lanes, Requested};
pub use policy::Policy;

/// A block of FFN weights, numbered by the caller (the flash image's block index). It also
/// indexes the flags arena: one 32-bit flag per block.
pub type BlockId = u32;

/// A file the lanes opened ([`Lanes::open`]), by its index in their file table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId(pub u16);

/// One block to read: `len` bytes at `offset` of `file` hold block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRead {
    pub file: FileId,
    pub offset: u64,
    pub len: u32,
    pub block: BlockId,
}

/// A block's flag: no valid copy in the cache (never arrived, evicted, or being re-read).
pub const FLAG_EMPTY: u32 = 0;
/// A block's flag: its whole bytes are in its cache slot.
pub const FLAG_READY: u32 = 1;
/// A block's flag: its last read failed after every retry (the slot holds nothing of it).
pub const FLAG_FAILED: u32 = 2;

/// The flags arena as atomics: `words` carved as `u32` from `boot::Arenas::flags`.
///
/// The invariant every reader relies on: a flag reads [`FLAG_READY`] (loaded with Acquire) only
/// after the block's whole bytes were copied into its slot (the flag is stored with Release after
/// the copy), and it is cleared (Release) before a slot is given to another block.
pub fn flags_from_words(words: &mut [u32]) -> &[std::sync::atomic::AtomicU32] {
    const _: () = assert!(
        std::mem::align_of::<std::sync::atomic::AtomicU32>() == std::mem::align_of::<u32>()
    );
    // SAFETY: AtomicU32 has the same size and bit validity as u32, and (asserted above) the same
    // alignment on this target; the exclusive borrow of `words` becomes a shared borrow of the
    // atomics for the same lifetime, so no plain access can race with them.
    unsafe { &*(words as *mut [u32] as *const [std::sync::atomic::AtomicU32]) }
}
