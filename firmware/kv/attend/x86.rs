//! The float caches' scores on x86 with AVX2: eight key rows dotted with a query at once, each
//! the bits [`super::dot_of`] gives it; and their rows' loads (a half's, a conversion).

use super::{FloatValue, SCORE_BLOCK};
use std::arch::x86_64::*;

/// [`super::dot_of`] of `q` with each of the `SCORE_BLOCK` rows at the start of `rows` (`q.len()`
/// values each). A row's eight partial sums are `dot`'s (a product added to each lane, chunk
/// by chunk, never fused); their sum, `dot`'s chain of seven adds lane after lane, is done for
/// the eight rows at once: the partial sums transposed, then seven vector adds in lane order.
/// One dot at a time, that chain and its shuffles were a quarter of attention's time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dots_of_rows<E: FloatValue>(q: &[f32], rows: &[E]) -> [f32; SCORE_BLOCK] {
    let hd = q.len();
    assert!(
        hd.is_multiple_of(8) && rows.len() >= SCORE_BLOCK * hd,
        "{SCORE_BLOCK} rows of {hd} (whole chunks of 8) from {} values",
        rows.len()
    );
    let mut acc = [_mm256_setzero_ps(); SCORE_BLOCK];
    for c in (0..hd).step_by(8) {
        // SAFETY: c + 8 <= hd = q.len(), and p * hd + c + 8 <= SCORE_BLOCK * hd <= rows.len()
        // (asserted above); unaligned loads.
        let x = unsafe { _mm256_loadu_ps(q.as_ptr().add(c)) };
        for (p, acc) in acc.iter_mut().enumerate() {
            let y = unsafe { load(rows.as_ptr().add(p * hd + c)) };
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(x, y));
        }
    }
    let lanes = transpose(acc);
    let mut sum = lanes[0];
    for lane in &lanes[1..] {
        sum = _mm256_add_ps(sum, *lane);
    }
    let mut out = [0f32; SCORE_BLOCK];
    // SAFETY: `out` holds 8 floats; an unaligned store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
    out
}

/// The first eight values of `x` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load8<E: FloatValue>(x: &[E]) -> [f32; 8] {
    assert!(x.len() >= 8, "eight values from {}", x.len());
    let mut out = [0f32; 8];
    // SAFETY: eight values at x (asserted); `out` holds eight floats; unaligned accesses.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), load(x.as_ptr())) };
    out
}

/// Eight values from `p` as f32: f32 loaded, halves loaded and converted (exactly).
///
/// # Safety
/// Eight values of `E` are readable at `p` (any alignment).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load<E: FloatValue>(p: *const E) -> __m256 {
    if E::HALF {
        // SAFETY: eight halves are 16 bytes at p (the caller's promise).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    } else {
        // SAFETY: eight f32 at p (the caller's promise).
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
}

/// Eight vectors' lane `j` gathered into vector `j` (row `p`'s lane in place `p`).
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose(r: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved, then quads, then the 128-bit halves: the usual 8x8 transpose.
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[4g + k] holds lane k (and k + 4) of rows 4g..4g + 4.
    let u: [__m256; 8] = std::array::from_fn(|i| {
        let (g, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + k / 2], t[4 * g + 2 + k / 2]);
        if k % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    std::array::from_fn(|j| {
        if j < 4 {
            _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j])
        }
    })
}
