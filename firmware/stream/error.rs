//! The streaming errors: refusals at construction ([`StreamError`]), a request the lanes
//! cannot take ([`RequestError`]), and a read that failed for good ([`ReadError`]). None of the
//! run-time ones allocates: they carry numbers, and `Display` writes the sentence.

use super::{BlockId, FileId};
use std::fmt;

/// The lanes or the cache cannot be built as asked.
#[derive(Debug)]
pub enum StreamError {
    /// The staging arena cannot hold one buffer per in-flight read.
    Staging { needed: usize, available: usize },
    /// Blocks are numbered past the flags arena.
    Flags { blocks: usize, flags: usize },
    /// The FFN-cache arena cannot hold the slots.
    CacheArena {
        slots: usize,
        slot_bytes: usize,
        needed: usize,
        available: usize,
    },
    /// The pinned (hot) blocks leave no slot for the others.
    TooManyHot { hot: usize, slots: usize },
    /// A configuration value is out of range (which, and why).
    Config(&'static str),
    /// A file could not be opened.
    Open {
        path: String,
        source: std::io::Error,
    },
    /// The file table is full.
    TooManyFiles { max: usize },
    /// The I/O backend could not be set up.
    Backend(std::io::Error),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Staging { needed, available } => write!(
                f,
                "the I/O lanes need {needed} bytes of staging buffers but budget.io_staging gives {available}"
            ),
            StreamError::Flags { blocks, flags } => write!(
                f,
                "{blocks} blocks need {blocks} flags but budget.flags holds {flags}"
            ),
            StreamError::CacheArena { slots, slot_bytes, needed, available } => write!(
                f,
                "the weight cache's {slots} slots of {slot_bytes} bytes need {needed} bytes but budget.ffn_cache gives {available}"
            ),
            StreamError::TooManyHot { hot, slots } => write!(
                f,
                "{hot} pinned hot blocks leave no room in a cache of {slots} slots"
            ),
            StreamError::Config(why) => write!(f, "bad streaming configuration: {why}"),
            StreamError::Open { path, source } => write!(f, "cannot open {path}: {source}"),
            StreamError::TooManyFiles { max } => {
                write!(f, "the I/O lanes hold at most {max} open files")
            }
            StreamError::Backend(e) => write!(f, "cannot set up the I/O backend: {e}"),
        }
    }
}

impl std::error::Error for StreamError {}

/// A request the lanes refused at once (nothing was queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The queue, or queued + in-flight + arrived-but-not-taken reads, are at their limit.
    Full { limit: usize },
    /// O_DIRECT needs the offset and length on `align` boundaries.
    Misaligned { block: BlockId, align: usize },
    /// The block is larger than a staging buffer or a cache slot.
    TooLong {
        block: BlockId,
        len: u32,
        max: usize,
    },
    /// The block id is past the flags arena.
    NoSuchBlock { block: BlockId, blocks: usize },
    /// The file id was not opened by these lanes.
    NoSuchFile { file: FileId },
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Full { limit } => write!(
                f,
                "the I/O lanes already hold {limit} reads (queued, in flight, or arrived and not yet taken)"
            ),
            RequestError::Misaligned { block, align } => write!(
                f,
                "block {block}'s offset or length is not a multiple of {align} bytes (O_DIRECT)"
            ),
            RequestError::TooLong { block, len, max } => write!(
                f,
                "block {block} is {len} bytes, more than the {max} a staging buffer and a cache slot hold"
            ),
            RequestError::NoSuchBlock { block, blocks } => {
                write!(f, "block {block} is past the {blocks} blocks the flags hold")
            }
            RequestError::NoSuchFile { file } => {
                write!(f, "file {} was not opened by the I/O lanes", file.0)
            }
        }
    }
}

impl std::error::Error for RequestError {}

/// Why a read failed on its last attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadErrorKind {
    /// The kernel returned an error (`errno`: EIO, ...).
    Io(i32),
    /// Fewer bytes than asked came back (`got` of the block's length).
    Short { got: u32 },
    /// No bytes at all: the block lies past the file's end (truncated under the reader).
    PastEnd,
    /// Every cache slot is pinned, so the whole block had nowhere to go.
    NoSlot,
    /// The block was asked for and never landed within the GPU kernel's time bound (a lane
    /// that stalled): the layer ended without it.
    Stalled,
}

/// A block read that failed on every attempt; the lanes go on with the other reads and the
/// cache holds nothing of this block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadError {
    pub block: BlockId,
    pub file: FileId,
    pub offset: u64,
    pub len: u32,
    pub attempts: u32,
    pub kind: ReadErrorKind,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ReadError {
            block,
            file,
            offset,
            len,
            attempts,
            kind,
        } = *self;
        write!(
            f,
            "reading block {block} ({len} bytes at offset {offset} of file {}) failed after {attempts} attempts: ",
            file.0
        )?;
        match kind {
            ReadErrorKind::Io(errno) => {
                write!(f, "{}", std::io::Error::from_raw_os_error(errno))
            }
            ReadErrorKind::Short { got } => write!(f, "short read ({got} of {len} bytes)"),
            ReadErrorKind::PastEnd => write!(f, "the file ends before the block (truncated?)"),
            ReadErrorKind::NoSlot => write!(f, "every cache slot is pinned"),
            ReadErrorKind::Stalled => {
                write!(f, "it did not land within the GPU kernel's time bound")
            }
        }
    }
}

impl std::error::Error for ReadError {}
