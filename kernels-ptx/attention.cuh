// Decode attention (decode.cu includes this at its place in the step): one kernel, `attention`
// (f32 cache), `attention_f16` (half cache) and `attention_i8` (int8 cache), with its launch
// policy beside it
// (`attention_launch`): a block a query head, split over slices once the context is long, and
// a kv head's query heads a block once a layer's cache outgrows the L2. engine/cuda.rs launches
// it; the host side of the policy is `max_slices`, `max_group_slices` and `group_from` there.
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

// Thread block clusters (sm_90): the blocks of a cluster run at once on one GPC and read each
// other's shared memory. A split attention whose slices are a cluster joins them there, after
// a hardware barrier, instead of through L2 (a fence, a counter, the last block's loads).
// Older architectures compile none of it; their host never launches clusters.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// The float at `p` (this block's shared memory) in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float ld_cluster(const float* p, unsigned rank) {
    float v = 0.0f;
#if __CUDA_ARCH__ >= 900
    unsigned a = (unsigned)__cvta_generic_to_shared(p), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
#endif
    return v;
}
// Most blocks a cluster of split attention has (the portable cluster size).
#define ATTENTION_CLUSTER_MAX 8

// One output element joined from n <= N slices' parts, `part(k)` giving slice k's (max, sum,
// unscaled value): every part's three loads are issued before any is used, so the join is one
// round trip (to L2, or to the cluster's shared memory).
template <int N, typename Part>
__device__ __forceinline__ float fold_parts(int n, Part part) {
    float mk[N], lk[N], vk[N];
#pragma unroll
    for (int k = 0; k < N; k++) {
        float3 p = k < n ? part(k) : make_float3(NEG_INF, 0.0f, 0.0f);
        mk[k] = p.x;
        lk[k] = p.y;
        vk[k] = p.z;
    }
    float mx = NEG_INF;
#pragma unroll
    for (int k = 0; k < N; k++) mx = fmaxf(mx, mk[k]);
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int k = 0; k < N; k++) {
        float f = mk[k] == NEG_INF ? 0.0f : expf(mk[k] - mx);  // a slice with no position: 0
        sum += lk[k] * f;
        acc += vk[k] * f;
    }
    return acc / sum;
}

// The last block of a split attention joins the `slices` parts (max, sum, unscaled values; in
// `apart`, `attend`'s layout) of each of its `hb` heads h0.. into the output xf and `out` (hb *
// head_dim floats). Latency rules: a join of many slices is on the step's chain, so each part's
// max and sum are loaded by a thread of their own, a warp a head folds them from shared memory
// (`scratch`: hb * slices floats), and each output element's loads are unrolled to be in
// flight together.
// Up to JOIN_DIRECT slices a value's thread folds them itself (`fold_parts`: one round trip to
// L2, where the general fold below takes two and three barriers).
#define JOIN_DIRECT 12
__device__ void join_slices(int h0, int hb, int slices, int head_dim, const float* apart,
                            float* scratch, float* head_sum, float* xf, float* out) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int stride = head_dim + 2;
    if (slices <= JOIN_DIRECT) {
        for (int i = threadIdx.x; i < hb * head_dim; i += blockDim.x) {
            int e = i / head_dim, d = i % head_dim;
            const float* pk = apart + (size_t)(h0 + e) * slices * stride;
            float v = fold_parts<JOIN_DIRECT>(slices, [&](int k) {
                const float* p = pk + (size_t)k * stride;
                return make_float3(__ldcg(p), __ldcg(p + 1), __ldcg(p + 2 + d));
            });
            xf[(h0 + e) * head_dim + d] = v;
            out[i] = v;
        }
        return;
    }
    float* ms = scratch;                // [hb][slices]: each part's max, then its factor
    float* ls = scratch + hb * slices;  // [hb][slices]: each part's sum
    __syncthreads();                    // (scratch is the warps' parts, read by the join before)
    for (int i = threadIdx.x; i < hb * slices; i += blockDim.x) {
        const float* pk = apart + (size_t)(h0 * slices + i) * stride;
        ms[i] = __ldcg(pk);
        ls[i] = __ldcg(pk + 1);
    }
    __syncthreads();
    for (int e = warp; e < hb; e += blockDim.x >> 5) {
        float mx = NEG_INF;
        for (int k = lane; k < slices; k += 32) mx = fmaxf(mx, ms[e * slices + k]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int k = lane; k < slices; k += 32) {
            float mk = ms[e * slices + k];
            float f = mk == NEG_INF ? 0.0f : expf(mk - mx);  // a slice that had no position: 0
            ms[e * slices + k] = f;
            sum += ls[e * slices + k] * f;
        }
        sum = warp_sum(sum);
        if (lane == 0) head_sum[e] = sum;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hb * head_dim; i += blockDim.x) {
        int e = i / head_dim, d = i % head_dim;
        const float* pk = apart + (size_t)(h0 + e) * slices * stride + 2 + d;
        const float* f = ms + e * slices;
        float acc = 0.0f;
#pragma unroll 16
        for (int k = 0; k < slices; k++) acc += __ldcg(pk + (size_t)k * stride) * f[k];
        float v = acc / head_sum[e];
        xf[(h0 + e) * head_dim + d] = v;
        out[i] = v;
    }
}

// Attention at position p = state[1] of the `hb` query heads h0 .. h0 + hb - 1, which share
// one kv head, over positions [t_begin, t_end) of 0..=p, by one block of up to 32 warps. hb is
// 1 (a block a head) or the whole group of query heads of the kv head (`attention_launch`'s
// grouped mode, once the context is long): the block's warps are split among its heads (wph a
// head), and the warps of every head walk the same positions in the same order, so each key and
// value row comes from memory once and from L1 for the other heads, where a block a head read
// the kv head's rows once per query head.
//
// First the rotary embedding of the q heads and of the kv head's k (in qkv = [q | k | v]); the
// first block of a group's first slice stores k and v in the cache row p (the others use the
// rotated k and the v in hand for p, so no block waits on another); then scores, softmax and the
// weighted sum of values in one pass, with an online softmax (running max, sum, and weighted
// values) in each warp (`attend_f32_loop`, `attend_i8_loop`). The block then joins each head's warps:
// into the output when it has all of the head's positions (`slices` 1), else into its slice's
// part (max, sum, unscaled values) in `apart`, and the last of the `slices` blocks to finish
// (counted in `*acount`) joins the slices of its heads (`join_slices`). The output is the wo
// product's input: xf[h * head_dim ..], and with xq its int8 blocks (head_dim % 32 == 0: blocks
// of 32 do not cross heads). head_dim: a multiple of 4, at most 256; hb * head_dim <= 1024.
//
// With I8 the cache is int8 (w8a8, w4a8; as the CPU's kv::KvCache in its token-major layout):
// row t of a layer is kv_dim int8 values at kcache + t * kv_dim, and one float scale per kv
// head and group of 32 at kscales + (t * n_kv_heads + kvh) * groups (quantize_head: d =
// amax / 127, round half away). Every block quantizes k and v of p itself (in shared memory,
// the same bits as the stored row), so it attends over exactly what the CPU does. Keys may be
// divided per channel by `key_scale` (kv::key_scales_from_bias, models with a K bias); the
// query is then multiplied by it and stays float, else it is quantized per group too and a
// group's q.k is one integer dot (dp4a), scaled once. See `attend_i8_loop`.
// attend's shared memory, declared once by the launch: a function's own __shared__ arrays are
// one set per template instantiation, and one launch must never hold two sets (the static
// limit is 48 KB), whichever instantiations it calls.
struct AttendShared {
    __align__(16) float qh[1024], kh[256], vh[256];
    // The half cache's k and v of p, as stored.
    __align__(16) f16 kh16[256], vh16[256];
    // The int8 path's queries, key and value of p (int8, and their group scales).
    __align__(16) i8 qq[1024], kq[256], vq[256];
    float qd[32], kd[8], vd[8];
    __align__(16) float warp_o[32][256];
    float warp_m[32], warp_l[32];
    // Each head's max over its warps (the join's).
    float head_mx[32];
    // A cluster's slice's part (max, sum, head_dim unscaled values; hb 1).
    float cpart[2 + 256];
    int last;
};

template <int KV, bool CLUSTER>
__device__ void attend(AttendShared& sh, int h0, int hb, int slice, int slices,
                       const float* qkv, int n_heads, int n_kv_heads, int head_dim, float base,
                       int half_split, int pos, float* kcache, float* vcache, float* kscales,
                       float* vscales, bool key_scaled, float fk, float* xf, i8* xq,
                       float* apart, unsigned* acount, bool cluster_join = CLUSTER) {
    // (KV: what the cache holds, KV_F32, KV_I8 or KV_F16; CLUSTER: compiled for the cluster
    // kernel; cluster_join: this call's slices are a cluster, joined in shared memory, else
    // through L2.)
    constexpr bool I8 = KV == KV_I8, HALF = KV == KV_F16;
    float *qh = sh.qh, *kh = sh.kh, *vh = sh.vh, *qd = sh.qd, *kd = sh.kd, *vd = sh.vd;
    i8 *qq = sh.qq, *kq = sh.kq, *vq = sh.vq;
    float(*warp_o)[256] = sh.warp_o;
    float *warp_m = sh.warp_m, *warp_l = sh.warp_l, *cpart = sh.cpart;
    int& last = sh.last;
    int group = n_heads / n_kv_heads, kvh = h0 / group;
    int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim, half = head_dim / 2;
    int chunk = (pos + slices) / slices;  // positions per slice: ceil((pos + 1) / slices)
    int t_begin = slice * chunk, t_end = min(pos + 1, t_begin + chunk);
    const float* ksrc = qkv + q_dim + kvh * head_dim;
    const float* vsrc = qkv + q_dim + kv_dim + kvh * head_dim;
    // Pairs of the q heads, then of k, rotated as the CPU's rope. qkv was written by the kernel
    // before, on other multiprocessors: read through L2 (__ldcg).
    for (int t = threadIdx.x; t < (hb + 1) * half; t += blockDim.x) {
        int which = t / half, i = t % half;
        const float* src = which < hb ? qkv + (h0 + which) * head_dim : ksrc;
        float* dst = which < hb ? qh + which * head_dim : kh;
        float freq = powf(base, -((float)(2 * i)) / (float)head_dim);
        float s, c;
        sincosf((float)pos * freq, &s, &c);
        int a = half_split ? i : 2 * i, b = half_split ? i + half : 2 * i + 1;
        float x0 = __ldcg(src + a), x1 = __ldcg(src + b);
        dst[a] = x0 * c - x1 * s;
        dst[b] = x0 * s + x1 * c;
        // The half cache's k (and v below) as stored: p attends over its cache values.
        if (HALF && which == hb) sh.kh16[a] = f2h(dst[a]), sh.kh16[b] = f2h(dst[b]);
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        vh[i] = __ldcg(vsrc + i);
        if (HALF) sh.vh16[i] = f2h(vh[i]);
    }
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int groups = head_dim / 32;
    if (I8) {
        // One warp a group of 32: k (over its key scale, `fk`, this thread's channel's), v, and
        // each q (times the key scale, or quantized). (2 + hb) * groups <= 32 warps.
        if (warp < (2 + hb) * groups) {
            int g = warp % groups, what = warp / groups, i = g * 32 + lane;
            int qi = (what - 2) * head_dim + i;  // for what >= 2: head what - 2
            if (what >= 2 && key_scaled) {
                qh[qi] = qh[qi] * fk;
            } else {
                float x = what == 0 ? (key_scaled ? kh[i] / fk : kh[i]) : what == 1 ? vh[i] : qh[qi];
                float d;
                int q = quant32(x, d);
                if (what == 0) kq[i] = (i8)q;
                else if (what == 1) vq[i] = (i8)q;
                else qq[qi] = (i8)q;
                if (lane == 0) {
                    if (what == 0) kd[g] = d;
                    else if (what == 1) vd[g] = d;
                    else qd[(what - 2) * groups + g] = d;
                }
            }
        }
        __syncthreads();
        if (h0 % group == 0 && slice == 0) {
            size_t row = (size_t)pos * kv_dim + kvh * head_dim;
            size_t srow = ((size_t)pos * n_kv_heads + kvh) * groups;
            for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
                ((i8*)kcache)[row + i] = kq[i];
                ((i8*)vcache)[row + i] = vq[i];
            }
            for (int i = threadIdx.x; i < groups; i += blockDim.x) {
                kscales[srow + i] = kd[i];
                vscales[srow + i] = vd[i];
            }
        }
    } else if (t_end == pos + 1) {
        // The float caches: every block whose slice holds p stores k and v there (the same
        // values from each of a kv head's blocks) and reads them back from the cache with the
        // rows before, after the barrier, so the loop has no case for p.
        using T = typename FloatCache<HALF>::Value;
        T* krow = (T*)kcache + (size_t)pos * kv_dim + kvh * head_dim;
        T* vrow = (T*)vcache + (size_t)pos * kv_dim + kvh * head_dim;
        const T *ks = HALF ? (const T*)sh.kh16 : (const T*)kh, *vs = HALF ? (const T*)sh.vh16 : (const T*)vh;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            krow[i] = ks[i];
            vrow[i] = vs[i];
        }
        __syncthreads();
    }

    // This warp's head (hi; none when hi >= hb) and its place among the head's wph warps.
    int wph = nw / hb, hi = warp / wph, wi = warp % wph;
    float scale = 1.0f / sqrtf((float)head_dim);
    float m = NEG_INF, l = 0.0f;
    if (hi >= hb) {
        // a warp left over when the heads do not divide the warps: no position
    } else if (I8) {
        attend_i8_loop(t_begin, t_end, pos, head_dim, kv_dim, n_kv_heads, kvh, scale,
                       (const i8*)kcache, (const i8*)vcache, kscales, vscales, key_scaled,
                       qh + hi * head_dim, qq + hi * head_dim, qd + hi * groups, kq, kd, vq, vd,
                       wi, wph, m, l, warp_o[warp]);
    } else {
        // The float caches: T the stored value's type.
        using T = typename FloatCache<HALF>::Value;
        const T *kc = (const T*)kcache, *vc = (const T*)vcache;
        const float* q = qh + hi * head_dim;
        // Rounds of 8 positions for half rows (their loads in flight take the registers of 4
        // f32 rows) where each warp has 8 or more, else 4 (a short context: a round of 8 would
        // load and score rows no warp uses); 4 for f32 rows, 2 for heads of 256.
        if (head_dim <= 128 && HALF && t_end - t_begin >= 8 * wph)
            attend_f32_loop<T, 1, 8>(t_begin, t_end, head_dim, kv_dim, kvh, scale, kc, vc, q, wi,
                                     wph, m, l, warp_o[warp]);
        else if (head_dim <= 128)
            attend_f32_loop<T, 1, 4>(t_begin, t_end, head_dim, kv_dim, kvh, scale, kc, vc, q, wi,
                                     wph, m, l, warp_o[warp]);
        else
            attend_f32_loop<T, 2, 2>(t_begin, t_end, head_dim, kv_dim, kvh, scale, kc, vc, q, wi,
                                     wph, m, l, warp_o[warp]);
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
    __syncthreads();
    // Join each head's warps: each output element rescales the head's warps' parts to their
    // max. Warp e first makes head e's max (a shuffle reduction, not a loop a thread) and each
    // of its warps' factor, in place of the warp's max (0 for a warp that had no position, whose
    // part is not written): the element loop below is then loads and multiply-adds, in the
    // order and with the values the loop a thread made before.
    if (warp < hb) {
        int w = warp * wph + lane;
        float mw = lane < wph ? warp_m[w] : NEG_INF;
        float mx = warp_max(mw);
        if (lane < wph) warp_m[w] = mw == NEG_INF ? 0.0f : expf(mw - mx);
        if (lane == 0) sh.head_mx[warp] = mx;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hb * head_dim; i += blockDim.x) {
        int e = i / head_dim, d = i % head_dim, w0 = e * wph;
        float mx = sh.head_mx[e];
        float sum = 0.0f, acc = 0.0f;
#pragma unroll 4
        for (int w = w0; w < w0 + wph; w++) {
            float f = warp_m[w], lw = warp_l[w], ow = warp_o[w][d];
            sum = f != 0.0f ? fmaf(lw, f, sum) : sum;
            acc = f != 0.0f ? fmaf(ow, f, acc) : acc;
        }
        if (slices == 1) {
            xf[(h0 + e) * head_dim + d] = acc / sum;
            qh[i] = acc / sum;  // q is no longer needed: the output, for quantizing
        } else if (CLUSTER && cluster_join) {
            cpart[2 + d] = acc;
            if (d == 0) {
                cpart[0] = mx;
                cpart[1] = sum;
            }
        } else {
            float* part = apart + (size_t)((h0 + e) * slices + slice) * (head_dim + 2);
            part[2 + d] = acc;
            if (d == 0) {
                part[0] = mx;
                part[1] = sum;
            }
        }
    }
    if (CLUSTER && cluster_join && slices > 1) {
        // The cluster's first block joins every slice's part from the blocks' shared memory
        // (each value's thread loading them all at once); the others stay until it has read.
        cluster_sync();
        if (slice == 0)
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
                float v = fold_parts<ATTENTION_CLUSTER_MAX>(slices, [&](int k) {
                    return make_float3(ld_cluster(&cpart[0], k), ld_cluster(&cpart[1], k),
                                       ld_cluster(&cpart[2 + d], k));
                });
                xf[h0 * head_dim + d] = v;
                qh[d] = v;  // for quantizing, as with one slice
            }
        cluster_sync();
        if (slice != 0) return;
    } else if (slices > 1) {
        // The last of the slices' blocks to finish joins all of them.
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(acount, 1u) == (unsigned)slices - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (threadIdx.x == 0) *acount = 0;
        join_slices(h0, hb, slices, head_dim, apart, &warp_o[0][0], warp_m, xf, qh);
    }
    if (xq) {
        __syncthreads();
        float* xd = (float*)(xq + q_dim);
        int* xs = (int*)(xd + q_dim / 32);
        int blocks = head_dim / 32;
        if (warp < hb * blocks) quant_lane(qh[warp * 32 + lane], h0 * blocks + warp, xq, xd, xs);
    }
}

// Pulls `lines` 128-byte lines from `pf` into L2, spread over `threads` threads of which this is
// thread `i`.
__device__ __forceinline__ void prefetch_l2(const u8* pf, int lines, int i, int threads) {
    for (; i < lines; i += threads) prefetch_line(pf + (size_t)i * 128);
}

// The attention launch. Short contexts: `n_heads` blocks, one a head (`attend` with hb 1).
// Once the position reaches `slice_positions` a head is split over several blocks, each a slice
// of its positions, one more for every `slice_positions` (0: never split), up to `max_slices`:
// one block a head would read a long context's keys and values with a few multiprocessors
// while the rest idle. With `max_group_slices` > 0 (the host allows it: a group of query heads
// fits one block), from position `group_from` on, a split block takes all the query heads of a
// kv head instead (grouped mode), over one more slice for every `slice_positions / group`
// positions, up to `max_group_slices`: the kv head's rows are then read once, not once per
// query head (the host starts it where a layer's cache outgrows the L2). Blocks past those do no
// attention: they pull `pf_lines` 128-byte lines from `pf` (the next products' weights) into
// L2 while the heads run, and the memory would otherwise idle.
// Which blocks attend to what at position `pos` (`attention_launch`): `units` query heads, or
// kv heads when grouped (`hb` query heads a block), times `slices` slices of the positions.
struct AttentionPlan {
    int units, slices, hb;
    bool grouped;
};
__device__ __forceinline__ AttentionPlan attention_plan(int pos, int n_heads, int n_kv_heads,
                                                        int max_slices, int slice_positions,
                                                        int max_group_slices, int group_from) {
    AttentionPlan p = {n_heads, 1, 1, false};
    if (slice_positions > 0) p.slices = max(1, min(max_slices, (pos + slice_positions) / slice_positions));
    if (max_group_slices > 0 && slice_positions > 0 && pos >= max(group_from, slice_positions)) {
        int group = n_heads / n_kv_heads;
        p = {n_kv_heads, (int)(((long long)pos + 1) * group / slice_positions), group, true};
        p.slices = max(1, min(max_group_slices, p.slices));
    }
    return p;
}

// What block `blockIdx.x` of the launch does at position `pos` (`attention_launch`): attend
// for query heads h0 .. h0 + hb - 1 over slice `slice` of `slices` (its counter `unit`, its
// slices joined in a cluster or through L2), pull weights into L2, or nothing.
enum { WORK_ATTEND, WORK_PREFETCH, WORK_IDLE };
struct AttentionWork {
    int what, h0, hb, slice, slices, unit, items;
    bool cluster_join;
};
template <bool CLUSTER>
__device__ __forceinline__ AttentionWork attention_work(int pos, int n_heads, int n_kv_heads,
                                                        int max_slices, int slice_positions,
                                                        int max_group_slices, int group_from,
                                                        int cluster, int cluster_slice,
                                                        int cluster_until) {
    int b = blockIdx.x;
    if (CLUSTER && pos < cluster_until) {
        int unit = b / cluster, rank = b % cluster, items = n_heads * cluster;
        int slices = pos >= cluster_slice ? cluster : 1;
        int what = b >= items ? WORK_PREFETCH : slices == 1 && rank > 0 ? WORK_IDLE : WORK_ATTEND;
        return {what, unit, 1, rank, slices, unit, items, true};
    }
    AttentionPlan p = attention_plan(pos, n_heads, n_kv_heads, max_slices, slice_positions,
                                     max_group_slices, group_from);
    int items = p.units * p.slices, unit = b % p.units;
    return {b >= items ? WORK_PREFETCH : WORK_ATTEND, p.grouped ? unit * (n_heads / n_kv_heads) : unit,
            p.hb, b / p.units, p.slices, unit, items, false};
}

// The cluster launch (CLUSTER: sm_90, launched as clusters of `cluster` consecutive blocks):
// below position `cluster_until`, head h is cluster h, whose blocks split its positions from
// `cluster_slice` on (before, its first block alone attends) and join their slices in shared
// memory, which costs so little that they split from a few rounds' positions on. From
// `cluster_until` on, the blocks run the plan above (slices joined through L2): it splits a
// head over up to `max_slices` blocks, more than a cluster's, which pays once the slices are
// long. Clusters past the heads prefetch, as blocks past the plan's do.
template <int KV, bool CLUSTER>
__device__ void attention_launch(const float* qkv, int n_heads, int n_kv_heads, int head_dim,
                                 float base, int half_split, const int* state, float* kcache,
                                 float* vcache, float* kscales, float* vscales,
                                 const float* key_scale, float* xf, i8* xq, const u8* pf,
                                 int pf_lines, float* apart, unsigned* acount, int max_slices,
                                 int slice_positions, int max_group_slices, int group_from,
                                 int cluster, int cluster_slice, int cluster_until, int pdl,
                                 unsigned long long* trace, int trace_slot) {
    int group = n_heads / n_kv_heads;
    // The int8 cache's key channel scale that this thread's warp quantizes with (attend: warp
    // w takes channel (w % groups) * 32 + lane), for this block's kv head in each mode. It is
    // written at boot, so it is loaded before the wait for the kernel before, off the step's
    // chain of latencies.
    float fk_head = 1.0f, fk_group = 1.0f, fk_cluster = 1.0f;
    if (KV == KV_I8 && key_scale) {
        int ch = ((threadIdx.x >> 5) % (head_dim / 32)) * 32 + (threadIdx.x & 31);
        fk_head = __ldg(key_scale + ((blockIdx.x % n_heads) / group) * head_dim + ch);
        fk_group = __ldg(key_scale + (blockIdx.x % n_kv_heads) * head_dim + ch);
        if (CLUSTER) {
            int h = min((int)blockIdx.x / cluster, n_heads - 1);
            fk_cluster = __ldg(key_scale + (h / group) * head_dim + ch);
        }
    }
    __shared__ AttendShared sh;
    trace_mark(trace, trace_slot, TRACE_START);
    pdl_start(pdl);
    trace_mark(trace, trace_slot, TRACE_WAITED);
    int pos = state[1];
    AttentionWork w = attention_work<CLUSTER>(pos, n_heads, n_kv_heads, max_slices, slice_positions,
                                              max_group_slices, group_from, cluster,
                                              cluster_slice, cluster_until);
    if (w.what == WORK_PREFETCH) {
        prefetch_l2(pf, pf_lines, (blockIdx.x - w.items) * blockDim.x + threadIdx.x,
                    (gridDim.x - w.items) * blockDim.x);
        trace_mark(trace, trace_slot, TRACE_END);
        return;
    }
    if (w.what == WORK_IDLE) {
        trace_mark(trace, trace_slot, TRACE_END);
        return;
    }
    float fk = w.cluster_join ? fk_cluster : w.hb > 1 ? fk_group : fk_head;
    // (The cluster kernel's one instantiation of attend, joining through L2 or in the cluster
    // as `cluster_join` says: a second would raise its registers into spills.)
    attend<KV, CLUSTER>(sh, w.h0, w.hb, w.slice, w.slices, qkv, n_heads, n_kv_heads, head_dim,
                        base, half_split, pos, kcache, vcache, kscales, vscales,
                        key_scale != nullptr, fk, xf, xq, apart, acount + w.unit, w.cluster_join);
    trace_mark(trace, trace_slot, TRACE_END);
}

// The f32 cache (`kscales`, `vscales`, `key_scale` unused), the int8 cache (`kcache`, `vcache`
// hold int8; see `attend`) and the half cache (they hold f16). engine.rs finds them by these
// names.
#define ATTENTION_ARGS                                                                          \
    const float *qkv, int n_heads, int n_kv_heads, int head_dim, float base, int half_split,  \
        const int *state, float *kcache, float *vcache, float *kscales, float *vscales,       \
        const float *key_scale, float *xf, i8 *xq, const u8 *pf, int pf_lines, float *apart,  \
        unsigned *acount, int max_slices, int slice_positions, int max_group_slices,          \
        int group_from, int cluster, int cluster_slice, int cluster_until, int pdl,             \
        unsigned long long *trace, int trace_slot
#define ATTENTION_PASS                                                                          \
    qkv, n_heads, n_kv_heads, head_dim, base, half_split, state, kcache, vcache, kscales,     \
        vscales, key_scale, xf, xq, pf, pf_lines, apart, acount, max_slices, slice_positions,   \
        max_group_slices, group_from, cluster, cluster_slice, cluster_until, pdl, trace, trace_slot
extern "C" __global__ void __launch_bounds__(1024) attention(ATTENTION_ARGS) {
    attention_launch<KV_F32, false>(ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(1024) attention_i8(ATTENTION_ARGS) {
    attention_launch<KV_I8, false>(ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(1024) attention_f16(ATTENTION_ARGS) {
    attention_launch<KV_F16, false>(ATTENTION_PASS);
}
// The same, launched as clusters of `cluster` blocks a head (sm_90; engine/cuda_attention.rs
// `AttentionSplit::cluster`): the split's slices join in shared memory.
extern "C" __global__ void __launch_bounds__(1024) attention_cluster(ATTENTION_ARGS) {
    attention_launch<KV_F32, true>(ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(1024) attention_i8_cluster(ATTENTION_ARGS) {
    attention_launch<KV_I8, true>(ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(1024) attention_f16_cluster(ATTENTION_ARGS) {
    attention_launch<KV_F16, true>(ATTENTION_PASS);
}
