//! Boot: the arenas every large buffer lives in, each allocated once from the board's budget, and
//! the check that a model fits them before any decoding starts.
//!
//! One anonymous mapping per arena (pages are only backed once touched, so a budget larger than
//! the model costs address space, not memory). Boot carves each arena into typed slices; nothing
//! is allocated from them afterwards, so the hot paths never touch the heap.
//!
//! Each `[budget]` of the board config has one owner ([`ArenaKind::owner`]): the engine carves
//! the dense weights, FFN cache, KV cache and activation scratch ([`Arenas`]); the I/O lanes the
//! staging buffers and the flags (mapped here, carved by the SSD-streaming runtime); the server
//! the request buffers.

use crate::board;
use memmap2::MmapMut;
use std::fmt;

/// Alignment of every slice carved from an arena: a cache line, and enough for any SIMD load.
pub const SLICE_ALIGN: usize = 64;

/// Which budget an arena draws from; the names match `[budget]` in the board config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArenaKind {
    DenseWeights,
    FfnCache,
    Kv,
    ActivationScratch,
    IoStaging,
    Flags,
    RequestBuffers,
}

impl ArenaKind {
    /// Every budget of the board config, in its order.
    pub const ALL: [ArenaKind; 7] = [
        ArenaKind::DenseWeights,
        ArenaKind::FfnCache,
        ArenaKind::Kv,
        ArenaKind::ActivationScratch,
        ArenaKind::IoStaging,
        ArenaKind::Flags,
        ArenaKind::RequestBuffers,
    ];

    pub fn field(self) -> &'static str {
        match self {
            ArenaKind::DenseWeights => "budget.dense_weights",
            ArenaKind::FfnCache => "budget.ffn_cache",
            ArenaKind::Kv => "budget.kv",
            ArenaKind::ActivationScratch => "budget.activation_scratch",
            ArenaKind::IoStaging => "budget.io_staging",
            ArenaKind::Flags => "budget.flags",
            ArenaKind::RequestBuffers => "budget.request_buffers",
        }
    }

    /// The board's budget for this arena.
    pub fn board_budget(self) -> usize {
        match self {
            ArenaKind::DenseWeights => board::DENSE_WEIGHTS_BYTES,
            ArenaKind::FfnCache => board::FFN_CACHE_BYTES,
            ArenaKind::Kv => board::KV_BYTES,
            ArenaKind::ActivationScratch => board::ACTIVATION_SCRATCH_BYTES,
            ArenaKind::IoStaging => board::IO_STAGING_BYTES,
            ArenaKind::Flags => board::FLAGS_BYTES,
            ArenaKind::RequestBuffers => board::REQUEST_BUFFERS_BYTES,
        }
    }

    /// Who carves this arena, and what it holds.
    pub fn owner(self) -> &'static str {
        match self {
            ArenaKind::DenseWeights => {
                "engine: embeddings, attention, norms, output head (resident after boot)"
            }
            ArenaKind::FfnCache => "engine: the FFN weights or neuron bundles",
            ArenaKind::Kv => "engine: the KV cache",
            ArenaKind::ActivationScratch => {
                "engine: activations, logits, sampler, sparse-FFN and tap buffers"
            }
            ArenaKind::IoStaging => {
                "I/O lanes: O_DIRECT read buffers (page-aligned, locked in memory by the daemon)"
            }
            ArenaKind::Flags => "I/O lanes and kernels: per-block arrival and completion flags",
            ArenaKind::RequestBuffers => "server: per-client request, text and output buffers",
        }
    }
}

/// Boot refused to go on: what is missing, in bytes.
#[derive(Debug)]
pub enum BootError {
    /// The model needs more of an arena than the board budgets.
    DoesNotFit {
        arena: ArenaKind,
        needed: usize,
        available: usize,
        what: String,
    },
    /// The operating system would not map the arena.
    Map {
        arena: ArenaKind,
        bytes: usize,
        source: std::io::Error,
    },
    /// The operating system would not lock the arena in memory.
    Lock {
        arena: ArenaKind,
        bytes: usize,
        source: std::io::Error,
    },
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootError::DoesNotFit { arena, needed, available, what } => write!(
                f,
                "the model does not fit board '{}': {what} needs {needed} bytes ({:.1} MiB) but {} is {available} bytes ({:.1} MiB)",
                board::NAME,
                *needed as f64 / 1048576.0,
                arena.field(),
                *available as f64 / 1048576.0
            ),
            BootError::Map { arena, bytes, source } => {
                write!(f, "cannot map {} ({bytes} bytes): {source}", arena.field())
            }
            BootError::Lock { arena, bytes, source } => write!(
                f,
                "cannot lock {} ({bytes} bytes) in memory: {source} (raise RLIMIT_MEMLOCK: `ulimit -l`, or LimitMEMLOCK= in the unit)",
                arena.field()
            ),
        }
    }
}

impl std::error::Error for BootError {}

/// Bytes a slice of `n` values of `T` takes in an arena, padding included.
pub const fn slice_bytes<T>(n: usize) -> usize {
    (n * std::mem::size_of::<T>()).div_ceil(SLICE_ALIGN) * SLICE_ALIGN
}

/// Adds up what a set of slices will take, so boot can refuse before it maps anything.
#[derive(Default, Clone, Copy, Debug)]
pub struct Plan {
    pub bytes: usize,
}

impl Plan {
    pub fn add<T>(&mut self, n: usize) {
        self.bytes += slice_bytes::<T>(n);
    }
    pub fn add_bytes(&mut self, n: usize) {
        self.bytes += n.div_ceil(SLICE_ALIGN) * SLICE_ALIGN;
    }
    /// Refuses when the plan is larger than `available` bytes of `arena`.
    pub fn check(&self, arena: ArenaKind, available: usize, what: &str) -> Result<(), BootError> {
        if self.bytes > available {
            return Err(BootError::DoesNotFit {
                arena,
                needed: self.bytes,
                available,
                what: what.to_string(),
            });
        }
        Ok(())
    }
}

/// The arenas boot maps from the board's budgets: the engine's four, and the I/O lanes' two
/// (mapped and, in the daemon, locked now, so their memory is owned from boot; the SSD-streaming
/// runtime carves them). The server maps its request buffers itself
/// (`ArenaKind::RequestBuffers`), sized by its client slots.
pub struct Arenas {
    pub dense: Arena,
    pub ffn: Arena,
    pub kv: Arena,
    pub scratch: Arena,
    pub io_staging: Arena,
    pub flags: Arena,
}

impl Arenas {
    /// Maps every arena at the size the board budgets (pages are backed only once touched).
    pub fn from_board() -> Result<Arenas, BootError> {
        Self::with_budget(
            ArenaKind::DenseWeights,
            ArenaKind::DenseWeights.board_budget(),
        )
    }

    /// As [`from_board`](Self::from_board), with `kind` mapped at `bytes` (at most its budget):
    /// a smaller board, for tests of the refusals.
    pub fn with_budget(kind: ArenaKind, bytes: usize) -> Result<Arenas, BootError> {
        let map = |k: ArenaKind| Arena::map(k, if k == kind { bytes } else { k.board_budget() });
        Ok(Arenas {
            dense: map(ArenaKind::DenseWeights)?,
            ffn: map(ArenaKind::FfnCache)?,
            kv: map(ArenaKind::Kv)?,
            scratch: map(ArenaKind::ActivationScratch)?,
            io_staging: map(ArenaKind::IoStaging)?,
            flags: map(ArenaKind::Flags)?,
        })
    }

    /// Locks the I/O staging and flag arenas in memory (`mlock`): the pages O_DIRECT reads
    /// land in, and that a GPU reads flags from, must never be paged out. The daemon calls it;
    /// the CLI's short runs need not.
    pub fn lock_io(&mut self) -> Result<(), BootError> {
        self.io_staging.lock()?;
        self.flags.lock()
    }
}

/// One arena: a single anonymous mapping of the size the board budgets (or less, when the
/// model needs less: the plan is checked against the budget first).
pub struct Arena {
    kind: ArenaKind,
    map: MmapMut,
}

/// Values that may be carved from an arena: plain numbers, valid for any bit pattern (a fresh
/// mapping is zeroed, and zero is a valid value of each).
pub trait ArenaValue: Copy + 'static {}
impl ArenaValue for u8 {}
impl ArenaValue for i8 {}
impl ArenaValue for u16 {}
impl ArenaValue for u32 {}
impl ArenaValue for i32 {}
impl ArenaValue for f32 {}

impl Arena {
    /// Maps `bytes` (rounded up to a page) for `kind`. Never more than the board's budget.
    pub fn map(kind: ArenaKind, bytes: usize) -> Result<Arena, BootError> {
        let budget = kind.board_budget();
        if bytes > budget {
            return Err(BootError::DoesNotFit {
                arena: kind,
                needed: bytes,
                available: budget,
                what: "the plan".to_string(),
            });
        }
        let len = bytes.max(1).div_ceil(4096) * 4096;
        let map = MmapMut::map_anon(len).map_err(|source| BootError::Map {
            arena: kind,
            bytes: len,
            source,
        })?;
        Ok(Arena { kind, map })
    }

    pub fn kind(&self) -> ArenaKind {
        self.kind
    }

    /// Locks the whole mapping in memory (`mlock`): its pages are faulted in now and never
    /// swapped out.
    pub fn lock(&mut self) -> Result<(), BootError> {
        self.map.lock().map_err(|source| BootError::Lock {
            arena: self.kind,
            bytes: self.map.len(),
            source,
        })
    }

    /// The mapping's start: page-aligned, so every carve of a multiple of the I/O block size
    /// starts on a block boundary (O_DIRECT).
    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Starts handing out slices; each arena is carved once.
    pub fn carver(&mut self) -> Carver<'_> {
        let kind = self.kind;
        Carver {
            kind,
            rest: &mut self.map[..],
            used: 0,
        }
    }
}

/// Hands out disjoint, aligned slices of one arena, front to back.
pub struct Carver<'a> {
    kind: ArenaKind,
    rest: &'a mut [u8],
    used: usize,
}

impl<'a> Carver<'a> {
    /// The next `n` values of `T`, zeroed (fresh mapping) or as left by an earlier carve.
    pub fn take<T: ArenaValue>(&mut self, n: usize) -> Result<&'a mut [T], BootError> {
        let bytes = slice_bytes::<T>(n);
        if bytes > self.rest.len() {
            return Err(BootError::DoesNotFit {
                arena: self.kind,
                needed: self.used + bytes,
                available: self.used + self.rest.len(),
                what: "carving".to_string(),
            });
        }
        let rest = std::mem::take(&mut self.rest);
        let (head, tail) = rest.split_at_mut(bytes);
        self.rest = tail;
        self.used += bytes;
        // SAFETY: `head` is exclusively borrowed for 'a, starts SLICE_ALIGN-aligned (the mapping is
        // page-aligned and every carve is a multiple of SLICE_ALIGN), holds at least
        // n * size_of::<T>() bytes, and T is a plain number type valid for any bit pattern.
        let typed = unsafe { std::slice::from_raw_parts_mut(head.as_mut_ptr().cast::<T>(), n) };
        debug_assert_eq!(head.as_ptr() as usize % SLICE_ALIGN, 0);
        Ok(typed)
    }

    /// Copies `src` into the next slice of bytes.
    pub fn copy_bytes(&mut self, src: &[u8]) -> Result<&'a [u8], BootError> {
        let dst = self.take::<u8>(src.len())?;
        dst.copy_from_slice(src);
        Ok(dst)
    }

    /// Bytes not yet handed out.
    pub fn left(&self) -> usize {
        self.rest.len()
    }

    pub fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carves_aligned_disjoint_slices() {
        let mut arena = Arena::map(ArenaKind::ActivationScratch, 1 << 16).unwrap();
        let mut c = arena.carver();
        let a = c.take::<f32>(3).unwrap();
        let b = c.take::<u8>(1).unwrap();
        let d = c.take::<i32>(100).unwrap();
        assert_eq!(a.as_ptr() as usize % SLICE_ALIGN, 0);
        assert_eq!(b.as_ptr() as usize % SLICE_ALIGN, 0);
        assert_eq!(d.as_ptr() as usize % SLICE_ALIGN, 0);
        a[2] = 1.5;
        b[0] = 7;
        d[99] = -3;
        assert_eq!((a[2], b[0], d[99]), (1.5, 7, -3));
        assert_eq!(c.used(), 64 + 64 + 448);
    }

    #[test]
    fn carving_past_the_end_names_the_arena() {
        let mut arena = Arena::map(ArenaKind::Kv, 4096).unwrap();
        let mut c = arena.carver();
        c.take::<f32>(1000).unwrap();
        let e = c.take::<f32>(100).unwrap_err();
        assert!(e.to_string().contains("budget.kv"), "{e}");
    }

    #[test]
    fn plan_over_budget_is_refused_with_bytes() {
        let mut p = Plan::default();
        p.add::<f32>(1 << 20);
        let e = p
            .check(ArenaKind::DenseWeights, 1 << 20, "the dense weights")
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("4194304 bytes") && msg.contains("1048576 bytes"),
            "{msg}"
        );
        assert!(msg.contains("budget.dense_weights"), "{msg}");
    }

    #[test]
    fn every_budget_has_an_owner_and_io_arenas_are_page_aligned() {
        for k in ArenaKind::ALL {
            assert!(k.field().starts_with("budget.") && !k.owner().is_empty());
        }
        let mut a = Arenas::from_board().unwrap();
        assert_eq!(a.io_staging.len(), board::IO_STAGING_BYTES);
        assert_eq!(a.io_staging.as_ptr() as usize % board::IO_BLOCK_ALIGN, 0);
        assert_eq!(a.flags.as_ptr() as usize % 4096, 0);
        // Root (CI) may lock them; elsewhere the refusal names the limit to raise.
        if let Err(e) = a.lock_io() {
            assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
        }
        let small = Arenas::with_budget(ArenaKind::Kv, 1 << 20).unwrap();
        assert_eq!(small.kv.len(), 1 << 20);
        assert_eq!(
            small.dense.len(),
            board::DENSE_WEIGHTS_BYTES.div_ceil(4096) * 4096
        );
    }

    #[test]
    fn arena_larger_than_budget_is_refused() {
        assert!(Arena::map(
            ArenaKind::ActivationScratch,
            board::ACTIVATION_SCRATCH_BYTES + 1
        )
        .is_err());
    }
}
