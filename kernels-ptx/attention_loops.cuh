// Decode attention's pass over a slice of positions, for one warp (attention.cuh's `attend`
// calls it): `attend_i8_loop` for the int8 cache, `attend_f32_loop` for the f32 and half ones,
// with their helpers. Each leaves the warp's online-softmax part (max, sum, weighted values).
// Uses decode.cu's conventions and common.cuh.

#pragma once
// Four int8 (one int) as exact floats without int-to-float conversions (I2F issues at a
// quarter of the FMA rate on sm_80/sm_90, and the int8 cache's loop is mostly conversions):
// each byte, biased to unsigned, becomes the low mantissa byte of 2^23 (one byte permute), and
// 2^23 + 128 is subtracted.
__device__ __forceinline__ float4 i8x4_to_f4(int w) {
    u32 u = (u32)w ^ 0x80808080u;
    const u32 two23 = 0x4B000000u;
    const float bias = 8388736.0f;  // 2^23 + 128
    return make_float4(__int_as_float(__byte_perm(u, two23, 0x7540)) - bias,
                       __int_as_float(__byte_perm(u, two23, 0x7541)) - bias,
                       __int_as_float(__byte_perm(u, two23, 0x7542)) - bias,
                       __int_as_float(__byte_perm(u, two23, 0x7543)) - bias);
}

// The int8 cache's pass over positions [t_begin, t_end) (attend's I8 path): scores, online
// softmax and weighted values, for this warp's positions, left in `wo` (head_dim floats) with
// the warp's max `m` and sum `l`; this is warp `warp` of the `nw` that share the head's
// positions. A lane takes 16 values (one 16-byte load) of a row, so a
// position takes L lanes (the power of two at or above head_dim / 16: 2, 4 or 8 for heads of
// 32 to 128) and a warp works on P = 32 / L positions at once. A group of 32 values is two
// lanes: its integer dot is summed over the pair and scaled once, as the CPU's attend_i8 does
// per group. Each round loads two positions a lane before using either, so their loads are in
// flight together; the warp finally merges its P position lanes.
__device__ void attend_i8_loop(int t_begin, int t_end, int pos, int head_dim, int kv_dim,
                               int n_kv_heads, int kvh, float scale, const i8* kcache,
                               const i8* vcache, const float* kscales, const float* vscales,
                               bool key_scaled, const float* qf, const i8* qq, const float* qd,
                               const i8* kq, const float* kd, const i8* vq, const float* vd,
                               int warp, int nw, float& m, float& l, float* wo) {
    int lane = threadIdx.x & 31;
    int n16 = head_dim / 16, groups = head_dim / 32;
    int L = n16 <= 2 ? 2 : n16 <= 4 ? 4 : 8, P = 32 / L, sub = lane / L, j = lane % L;
    bool in = j < n16;
    int g = j / 2;  // this lane's group of 32
    int4 qi = in ? ((const int4*)qq)[j] : make_int4(0, 0, 0, 0);
    float qs = in ? qd[g] : 0.0f;
    float o[16];
#pragma unroll
    for (int i = 0; i < 16; i++) o[i] = 0.0f;
    // One position's row, as this lane's 16 keys and 16 values and their group's scales (all 0
    // for a lane past the head).
    struct Row {
        int4 k, v;
        float ks, vs;
    };
    auto load = [&](int t) {
        Row w = {make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0), 0.0f, 0.0f};
        if (!in) return w;
        size_t row = (size_t)t * kv_dim + kvh * head_dim, srow = ((size_t)t * n_kv_heads + kvh) * groups;
        bool mine = t == pos;  // p's row is in shared memory (this block quantized it)
        w.k = mine ? ((const int4*)kq)[j] : __ldg((const int4*)(kcache + row) + j);
        w.v = mine ? ((const int4*)vq)[j] : __ldg((const int4*)(vcache + row) + j);
        w.ks = mine ? kd[g] : __ldg(kscales + srow + g);
        w.vs = mine ? vd[g] : __ldg(vscales + srow + g);
        return w;
    };
    // A position's score: each group's dot summed over its lane pair and scaled, then the
    // groups summed over the position's lanes (every lane of them gets it).
    auto score = [&](const Row& w) -> float {
        float f;
        if (key_scaled) {
            const float4* q4 = (const float4*)qf + 4 * j;
            int kw[4] = {w.k.x, w.k.y, w.k.z, w.k.w};
            f = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float4 k = i8x4_to_f4(kw[c]), q = in ? q4[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                f += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
            }
            f += __shfl_xor_sync(0xffffffff, f, 1);
            f = w.ks * f;
        } else {
            int d = __dp4a(w.k.x, qi.x, 0);
            d = __dp4a(w.k.y, qi.y, d);
            d = __dp4a(w.k.z, qi.z, d);
            d = __dp4a(w.k.w, qi.w, d);
            d += __shfl_xor_sync(0xffffffff, d, 1);
            f = (qs * w.ks) * (float)d;
        }
        for (int x = 2; x < L; x <<= 1) f += __shfl_xor_sync(0xffffffff, f, x);
        return f * scale;
    };
    // A round: positions base + sub and base + nw * P + sub (a uniform trip count for the warp).
    for (int base = t_begin + warp * P; base < t_end; base += 2 * nw * P) {
        int t0 = base + sub, t1 = base + nw * P + sub;
        bool ok0 = t0 < t_end, ok1 = t1 < t_end;
        Row w0 = load(ok0 ? t0 : t_begin), w1 = load(ok1 ? t1 : t_begin);
        // Every lane scores (the sums shuffle across the warp); a clamped one counts nothing.
        float s0 = score(w0), s1 = score(w1);
        s0 = ok0 ? s0 : NEG_INF;
        s1 = ok1 ? s1 : NEG_INF;
        float mn = fmaxf(m, fmaxf(s0, s1));
        if (mn == NEG_INF) continue;  // this lane's positions are past the end (so were all before)
        float c = expf(m - mn);
        float p0 = ok0 ? expf(s0 - mn) : 0.0f, p1 = ok1 ? expf(s1 - mn) : 0.0f;
        l = l * c + p0 + p1;
        float x0 = p0 * w0.vs, x1 = p1 * w1.vs;
        int va[4] = {w0.v.x, w0.v.y, w0.v.z, w0.v.w}, vb[4] = {w1.v.x, w1.v.y, w1.v.z, w1.v.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float4 a = i8x4_to_f4(va[q]), b = i8x4_to_f4(vb[q]);
            o[4 * q + 0] = o[4 * q + 0] * c + x0 * a.x + x1 * b.x;
            o[4 * q + 1] = o[4 * q + 1] * c + x0 * a.y + x1 * b.y;
            o[4 * q + 2] = o[4 * q + 2] * c + x0 * a.z + x1 * b.z;
            o[4 * q + 3] = o[4 * q + 3] * c + x0 * a.w + x1 * b.w;
        }
        m = mn;
    }
    // A warp that had no position (a short context leaves many idle) skips the merge: the
    // join passes over it (its m stays -inf).
    if (__all_sync(0xffffffff, m == NEG_INF)) return;
    // Merge the warp's P position lanes (lanes j, j + L, ...): all of them end with the merge.
    for (int x = L; x < 32; x <<= 1) {
        float m2 = __shfl_xor_sync(0xffffffff, m, x), l2 = __shfl_xor_sync(0xffffffff, l, x);
        float mn = fmaxf(m, m2);
        float c1 = mn == NEG_INF ? 0.0f : expf(m - mn), c2 = mn == NEG_INF ? 0.0f : expf(m2 - mn);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float o2 = __shfl_xor_sync(0xffffffff, o[i], x);
            o[i] = o[i] * c1 + o2 * c2;
        }
        l = l * c1 + l2 * c2;
        m = mn;
    }
    if (sub == 0 && in)
#pragma unroll
        for (int q = 0; q < 4; q++)
            ((float4*)wo)[4 * j + q] = make_float4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
}

// NP (1, 2, 4 or 8) per-lane partial sums, each summed over the warp: the lane ends with the
// whole sum of position lane / (32 / NP). A butterfly per sum takes 5 NP shuffles and adds;
// here the first steps trade the half of the sums a lane does not keep (the lanes of bit 16
// keep the upper half, then of bit 8 the upper quarter, ...), so 8 sums take 7, 4 take 6, 2
// take 5. Each sum gets a butterfly's additions in its order: the same bits.
template <int NP>
__device__ __forceinline__ float sum_halving(const float (&s)[NP], int lane) {
    float k;
    if (NP == 8) {
        // Three halvings (bits 16, 8, 4) of the eight sums to one.
        float h[NP];
#pragma unroll
        for (int i = 0; i < NP; i++) h[i] = s[i];
#pragma unroll
        for (int n = NP, bit = 16; n > 1; n /= 2, bit /= 2) {
            bool hi = lane & bit;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                float keep = hi ? h[n / 2 + i] : h[i], give = hi ? h[i] : h[n / 2 + i];
                h[i] = keep + __shfl_xor_sync(0xffffffff, give, bit);
            }
        }
        k = h[0];
    } else if (NP == 4) {
        bool hi = lane & 16, mid = lane & 8;
        float k0 = hi ? s[2] : s[0], k1 = hi ? s[3] : s[1];
        k0 += __shfl_xor_sync(0xffffffff, hi ? s[0] : s[2], 16);
        k1 += __shfl_xor_sync(0xffffffff, hi ? s[1] : s[3], 16);
        k = mid ? k1 : k0;
        k += __shfl_xor_sync(0xffffffff, mid ? k0 : k1, 8);
    } else if (NP == 2) {
        bool hi = lane & 16;
        k = hi ? s[1] : s[0];
        k += __shfl_xor_sync(0xffffffff, hi ? s[0] : s[1], 16);
    } else {
        k = s[0];
    }
#pragma unroll
    for (int x = 32 / NP / 2; x > 0; x >>= 1) k += __shfl_xor_sync(0xffffffff, k, x);
    return k;
}

// Four values of a cache row as loaded (f32: a float4; half: 8 bytes, half the registers
// while a round's loads are in flight) and as floats (a half converts exactly).
template <typename T> struct Four { typedef float4 Raw; };
template <> struct Four<f16> { typedef uint2 Raw; };
__device__ __forceinline__ float4 to4(float4 v) { return v; }
__device__ __forceinline__ float4 to4(uint2 w) {
    return make_float4(h2f((f16)(w.x & 0xffff)), h2f((f16)(w.x >> 16)), h2f((f16)(w.y & 0xffff)),
                       h2f((f16)(w.y >> 16)));
}

// The value a float cache stores: f32, or (HALF) half.
template <bool HALF> struct FloatCache { typedef float Value; };
template <> struct FloatCache<true> { typedef f16 Value; };

// The float caches' pass over positions [t_begin, t_end) (attend's float path; T float for the
// f32 cache, f16 for the half one; every row in the cache, p's too), for warp `warp` of the
// `nw` that share the head's positions: scores, online softmax and weighted values, left in
// `wo` (head_dim floats) with the warp's max `m` and sum `l`. A lane takes R fours of a row
// (lane, lane + 32: heads of up to 128 * R; a lane past the head loads the head's last four
// and weighs it by a zero q), the warp sums the dots (`sum_halving`), and a round takes NP
// positions whose loads are all in flight before any is used: at long context a warp's
// rounds, each a wait on memory, are attention's time, so a round takes as many positions as
// the registers allow (NP 4 for f32 heads of 128, 8 for half ones, 2 for heads of 256). The
// loop is issue-bound too (32 warps a multiprocessor): a row's address is one multiply-add
// from the lane's pointers (32-bit element offsets: a layer's cache is under 2^31 values).
template <typename T, int R, int NP>
__device__ void attend_f32_loop(int t_begin, int t_end, int head_dim, int kv_dim, int kvh,
                                float scale, const T* kcache, const T* vcache, const float* q,
                                int warp, int nw, float& m, float& l, float* wo) {
    using Raw = typename Four<T>::Raw;
    int lane = threadIdx.x & 31, n4 = head_dim / 4;
    unsigned row4 = (unsigned)kv_dim / 4;  // a position's fours
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 qv[R], o[R];
    // This lane's first four of the kv head's row 0, and its others' distance from it (two
    // pointers, not 2R: heads of 256 keep their registers).
    int c = kvh * head_dim + 4 * min(lane, n4 - 1);
    const Raw *kl = (const Raw*)(kcache + c), *vl = (const Raw*)(vcache + c);
    unsigned dj[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int j = lane + 32 * r;
        qv[r] = j < n4 ? ((const float4*)q)[j] : zero;
        o[r] = zero;
        dj[r] = min(j, n4 - 1) - min(lane, n4 - 1);
    }
    for (int t0 = t_begin + warp; t0 < t_end; t0 += NP * nw) {
        Raw kr[NP][R], vr[NP][R];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            int t = t0 + p * nw;
            t = t < t_end ? t : t0;  // a position past the end loads t0's row again, and counts nothing
            unsigned at = (unsigned)t * row4;
#pragma unroll
            for (int r = 0; r < R; r++) {
                kr[p][r] = kl[r == 0 ? at : at + dj[r]];
                vr[p][r] = vl[r == 0 ? at : at + dj[r]];
            }
        }
        float s[NP];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            s[p] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float4 k = to4(kr[p][r]);
                s[p] += qv[r].x * k.x + qv[r].y * k.y + qv[r].z * k.z + qv[r].w * k.w;
            }
        }
        // The NP dots summed over the warp by halving (`sum_halving`): lane ends with position
        // pl's score, whose weight it alone makes; the others' come by shuffle.
        constexpr int LANES = 32 / NP;  // lanes that end with one position's score
        int pl = lane / LANES;
        float sp = sum_halving<NP>(s, lane);
        sp = t0 + pl * nw < t_end ? sp * scale : NEG_INF;
        float mx = sp;
#pragma unroll
        for (int x = LANES; x < 32; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, x));
        float mn = fmaxf(m, mx);
        float c = expf(m - mn);  // 0 on the first round (m = -inf, mn finite: t0 < t_end)
        float wl = expf(sp - mn);  // 0 for a position past the end
        l *= c;
#pragma unroll
        for (int r = 0; r < R; r++) {
            o[r].x *= c;
            o[r].y *= c;
            o[r].z *= c;
            o[r].w *= c;
        }
#pragma unroll
        for (int p = 0; p < NP; p++) {
            float w = __shfl_sync(0xffffffff, wl, p * LANES);
            l += w;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float4 v = to4(vr[p][r]);
                o[r].x += w * v.x;
                o[r].y += w * v.y;
                o[r].z += w * v.z;
                o[r].w += w * v.w;
            }
        }
        m = mn;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        int j = lane + 32 * r;
        if (j < n4) ((float4*)wo)[j] = o[r];
    }
}
