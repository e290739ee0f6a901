//! The CPU kernels' shared vocabulary: which implementation runs ([`Kernel`], detected once,
//! forced by tests and ablations), the input as the kernels see it (`Act`), and the chunk
//! function types of the low-bit kernels. It sits below both the dispatcher (`matvec`) and the
//! kernels (`lowbit`), so neither imports the other's internals.

/// Which implementation the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// aarch64 NEON (Q4_0, Q4_1, Q8_0 and the K-quants; the others run the scalar code).
    Neon,
}

/// The fastest kernel this CPU supports.
pub fn best_kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Kernel::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Kernel::Neon;
        }
    }
    Kernel::Scalar
}

/// Whether this CPU can run `k`.
pub fn kernel_supported(k: Kernel) -> bool {
    k == Kernel::Scalar || k == best_kernel()
}

/// The CPU kernels one engine runs: picked once at boot ([`KernelSet::best`], or an
/// ablation's) and passed by value to every product, so two engines in one process (a test
/// comparing kernels, a bench row beside another) never share a switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSet {
    pub kernel: Kernel,
    /// Low-bit weights: an integer dot with one dequantization per group (BitLLM 4.4).
    /// `false` is the "convert, then compute" ablation: every group dequantized to f32 first.
    pub deferred_dequant: bool,
    /// x86: VNNI's `vpdpbusd` where the CPU has it (`false`: the AVX2 `maddubs` + `madd` dot).
    pub vnni: bool,
    /// x86: the sixteen-row AVX-512 low-bit kernels where the CPU has AVX-512 VNNI (`false`:
    /// the eight-row ymm ones).
    pub avx512: bool,
    /// x86: software prefetch ahead of decode's one-pass kernels (w4 swizzled, w8, Q4_K and
    /// Q6_K rows), which stream their weights from DRAM. On by default on Intel CPUs, whose
    /// L2 streamer stops at each 4 KiB page (measured on the GPU machine's Xeon: 1.4-1.6x the
    /// GB/s at 2 and 8 threads); off elsewhere: a Zen 4 core's prefetchers follow the one pass
    /// alone, and the hints cost it 5-30% (docs/BENCHMARKS.md).
    pub prefetch: bool,
    /// K-quant rows: their input quantized with one scale per 256 values (llama.cpp's Q8_K)
    /// wherever only K-quant rows read it, so the AVX-512 kernels add a super-block's groups
    /// in integers (1.1-1.2x their speed). `false`: a scale per 32 values, as the classic
    /// types take it: finer (Qwen2.5-1.5B Q4_K_M's perplexity 0.4% lower, docs/BENCHMARKS.md)
    /// and slower.
    pub superblock_scales: bool,
    /// Attention tasks take several query heads of one KV head where that keeps the threads
    /// as busy as a task a head, so each row of the cache is read once for them all (`false`:
    /// a task a query head, as the classic engine: the `cpu-per-head-attention` ablation).
    /// The same bits either way.
    pub grouped_attention: bool,
}

impl KernelSet {
    /// The fastest set this CPU runs.
    pub fn best() -> KernelSet {
        KernelSet::with(best_kernel())
    }

    /// `kernel` with every fast path it has on. Panics if this CPU cannot run it (a fault in
    /// the caller: boot picks from [`best_kernel`], tests from [`kernel_supported`]).
    pub fn with(kernel: Kernel) -> KernelSet {
        assert!(
            kernel_supported(kernel),
            "{kernel:?} kernels are not supported on this CPU"
        );
        KernelSet {
            kernel,
            deferred_dequant: true,
            vnni: true,
            avx512: true,
            prefetch: intel_cpu(),
            superblock_scales: true,
            grouped_attention: true,
        }
    }

    /// The portable scalar kernels (the reference the others are tested against).
    pub fn scalar() -> KernelSet {
        KernelSet::with(Kernel::Scalar)
    }
}

/// Whether this is an Intel CPU (CPUID's vendor string), for `KernelSet::prefetch`.
fn intel_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        [id.ebx, id.edx, id.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e] // "GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl Default for KernelSet {
    fn default() -> KernelSet {
        KernelSet::best()
    }
}

/// The input as kernels see it: `x` itself, and (for the quant types) its int8 blocks:
/// value `c` ~ `d[c / 32] * qs[c]`, and `s[b] = d[b] * sum(qs of block b)`.
#[derive(Clone, Copy)]
pub(crate) struct Act<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) qs: &'a [i8],
    /// `qs` permuted per group for the lane-interleaved w4 packings (empty when unused); only
    /// the AVX2 w4 kernels read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) qp: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
    /// Minus the sums of `qs` in runs of four (`LANES` per block): the start of the x86
    /// kernels' unsigned dots, `sum (w + k) * y - k * sum y` (see `lane_sums`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) ls: &'a [i32],
    /// Minus the sum of each block of `qs` (the x86 eight-row kernels' start, per group).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) gs: &'a [i32],
    /// Minus the sums of `qs` in runs of 16, present (not empty) only when each 256 values
    /// share one scale (`matvec::ActScales::SuperBlock`): the AVX-512 K-quant kernels' form.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) hs: &'a [i16],
}

impl<'a> Act<'a> {
    /// The input alone, for kernels that read floats (no int8 blocks).
    pub(crate) fn plain(x: &'a [f32]) -> Act<'a> {
        Act {
            x,
            qs: &[],
            qp: &[],
            d: &[],
            s: &[],
            ls: &[],
            gs: &[],
            hs: &[],
        }
    }
}

/// 32-bit lanes of a block's dot product in a 256-bit register: four bytes each.
pub(crate) const LANES: usize = 8;

/// Most inputs one `matmul_many` call takes: the board's prefill batch.
pub const MAX_INPUTS: usize = crate::board::PREFILL_BATCH;

/// The low-bit kernels' chunk function (`crate::backend::cpu::lowbit`): `out.len()` adjacent rows of
/// `row_bytes` in `data`. Unsafe: the kernel's CPU features must be present, and `act` must
/// cover the rows' columns.
pub(crate) type QChunkFn = unsafe fn(data: &[u8], row_bytes: usize, act: &Act, out: &mut [f32]);

/// The low-bit kernels' many-input chunk function: `rows` adjacent rows against every input of
/// `acts`, input `t`'s row `r` into `out[t * out_stride + r]`. Unsafe: as `QChunkFn`, and `out`
/// must be valid for every index written.
pub(crate) type QChunkManyFn = unsafe fn(
    data: &[u8],
    row_bytes: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
);

/// aarch64 NEON helpers shared by the classic (`matvec`) and low-bit (`lowbit`) kernels.
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use std::arch::aarch64::*;

    /// Sum of the products of 16 signed bytes, as 4 lanes of i32 added to `acc`.
    #[inline]
    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn mul_acc(acc: int32x4_t, w: int8x16_t, y: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(y));
        let hi = vmull_s8(vget_high_s8(w), vget_high_s8(y));
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// x86 helpers the classic and K-quant kernels share.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// The sum of `v`'s eight floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The f16 at `p` (unaligned) as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
        let h = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }
}
