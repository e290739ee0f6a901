//! CPU backend: a fixed worker pool, matrix-vector products over GGML-typed weights, and the
//! sparse down projection over neuron bundles.

pub mod axpy;
pub mod down_tiles;
pub mod kernel;
pub mod lowbit;
pub mod matvec;
pub mod pool;
pub mod sparse_ffn;

pub use matvec::{
    matmul_many, matvec, matvec_many, ActScratch, Kernel, KernelSet, Matrix, Rows, Tile,
};
pub use pool::WorkerPool;

use crate::quant::{Packing, QuantError};

/// The int4 packing this CPU decodes fastest in (`--packing auto`, the default): swizzled
/// where an int8 dot is one instruction (x86 with VNNI, and aarch64, whose kernels read eight
/// or sixteen rows a register), interleaved on x86 without VNNI. There the eight-row kernel's
/// emulated dot (maddubs, madd, add) lost to the four-row one in decode: 1.06-1.30x on an
/// AVX2 EPYC, Q4_0 SmolLM2 and 1.5B (docs/BENCHMARKS.md); prefill then runs 0.85-0.9x.
/// Results are bit-identical in every packing.
pub fn preferred_packing() -> Packing {
    #[cfg(target_arch = "x86_64")]
    if lowbit::x86::vnni() == lowbit::x86::VNNI_NONE {
        return Packing::Interleaved;
    }
    Packing::Swizzled
}

/// A `--packing` value: a packing's name, or `auto` ([`preferred_packing`]).
pub fn parse_packing(s: &str) -> Result<Packing, QuantError> {
    match s {
        "auto" => Ok(preferred_packing()),
        _ => Packing::parse(s),
    }
}

/// An output buffer handed to pool tasks, each of which writes its own disjoint range (of
/// floats, or of a batch's activation scratch).
struct OutPtr<T = f32>(*mut T);
// SAFETY: only used to hand disjoint ranges of one `&mut [T]` to pool tasks.
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}

impl<T> OutPtr<T> {
    // A method, so that closures capture the whole `OutPtr` (Sync), not its raw field.
    fn ptr(&self) -> *mut T {
        self.0
    }
}

/// Calls `f(i, row)` for each row `i` of `rows` (`width` values each), one pool task per row:
/// the per-token steps of a prefill batch (norms, SwiGLU) run on every thread instead of one.
pub fn for_each_row(
    pool: &WorkerPool,
    rows: &mut [f32],
    width: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    assert!(
        width > 0 && rows.len().is_multiple_of(width),
        "{} values are not rows of {width}",
        rows.len()
    );
    let out = OutPtr(rows.as_mut_ptr());
    pool.run(rows.len() / width, &|i| {
        // SAFETY: task i alone touches row i, inside `rows`, which is borrowed mutably for the
        // whole run.
        let row = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(i * width), width) };
        f(i, row);
    });
}

/// `out` = the sum, in task order, of the `tasks` partial outputs in `partials`, one every
/// `stride` values (each `out.len()` long): a result that does not depend on which thread ran
/// which task.
fn sum_partials(partials: &[f32], tasks: usize, stride: usize, out: &mut [f32]) {
    out.fill(0.0);
    for p in partials[..tasks * stride].chunks_exact(stride) {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
}

/// How many gathered rows ahead the sparse kernels prefetch. The rows a token needs are scattered
/// over the FFN arena, so without a hint every row is a DRAM miss served one at a time; 8 rows
/// (a few KiB) ahead keeps enough misses in flight to stream.
pub const GATHER_PREFETCH_ROWS: usize = 16;

/// Prefetches the rows of the four chosen neurons `GATHER_PREFETCH_ROWS` after position `i` of
/// `ids` (gathers call it before each group of four, or before each single row at the end).
#[inline]
pub fn prefetch_gathered<'a>(ids: &[u32], i: usize, row: impl Fn(u32) -> &'a [u8]) {
    for &r in ids.iter().skip(i + GATHER_PREFETCH_ROWS).take(4) {
        prefetch(row(r));
    }
}

/// Hints the CPU to bring `bytes` into cache; never faults, changes no result.
#[inline]
pub fn prefetch(bytes: &[u8]) {
    let p = bytes.as_ptr();
    let mut off = 0;
    while off < bytes.len() {
        prefetch_line(p.wrapping_add(off));
        off += 64;
    }
    if let Some(last) = bytes.len().checked_sub(1) {
        prefetch_line(p.wrapping_add(last));
    }
}

#[inline]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is in the
    // x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint that never faults, whatever the address.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` is this CPU's preferred packing: swizzled unless x86 lacks VNNI; the names parse
    /// as themselves, and anything else is refused naming the choices.
    #[test]
    fn auto_packing_follows_the_cpu() {
        assert_eq!(parse_packing("auto").unwrap(), preferred_packing());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            preferred_packing() == Packing::Swizzled,
            lowbit::x86::vnni() != lowbit::x86::VNNI_NONE
        );
        for p in Packing::ALL {
            assert_eq!(parse_packing(p.name()).unwrap(), p);
        }
        let e = parse_packing("zigzag").unwrap_err().to_string();
        assert!(e.contains("'zigzag'") && e.contains("auto"), "{e}");
    }
}
