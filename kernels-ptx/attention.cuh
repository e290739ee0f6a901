// Decode attention (decode.cu includes this at its place in the step): one kernel, `attention`
// (f32 cache), `attention_f16` (half cache) and `attention_i8` (int8 cache), with its launch
// policy beside it
// (`attention_launch`): a block a query head, split over slices once the context is long, and
// a kv head's query heads a block once a layer's cache outgrows the L2. engine/cuda.rs launches
// it; the host side of the policy is `max_slices`, `max_group_slices` and `group_from` there.
// Uses decode.cu's conventions and common.cuh.

#pragma once
#include "attention_loops.cuh"

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

template <int KV, bool CLUSTER, typename Wait>
__device__ void attend(AttendShared& sh, int h0, int hb, int slice, int slices,
                       const float* qkv, int n_heads, int n_kv_heads, int head_dim, float base,
                       int half_split, int pos, float* kcache, float* vcache, float* kscales,
                       float* vscales, bool key_scaled, float fk, float* xf, i8* xq,
                       float* apart, unsigned* acount, bool cluster_join, Wait wait) {
    // (KV: what the cache holds, KV_F32, KV_I8 or KV_F16; CLUSTER: compiled for the cluster
    // kernel; cluster_join: this call's slices are a cluster, joined in shared memory, else
    // through L2; wait: the wait for the kernel before, called once, before qkv is read.)
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
    // Pairs of the q heads, then of k, rotated as the CPU's rope: item t < n_rot rotates pair
    // t % half of head t / half (head hb is k), the next head_dim items copy v. At most 896
    // items (hb * head_dim <= 1024, head_dim <= 256), and a block has at least half as many
    // threads (the host's `group_fits`, and 2 * head_dim for a head alone): a thread takes
    // item threadIdx.x and item threadIdx.x + blockDim.x. The angle needs only the position, so
    // it is made before the wait; after it, the one round trip that loads q, k and v. qkv was
    // written by the kernel before, on other multiprocessors: read through L2 (__ldcg).
    int n_rot = (hb + 1) * half;
    float s[2] = {0.0f, 0.0f}, c[2] = {1.0f, 1.0f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = threadIdx.x + r * blockDim.x, i = t % half;
        if (t < n_rot) {
            float freq = powf(base, -((float)(2 * i)) / (float)head_dim);
            sincosf((float)pos * freq, &s[r], &c[r]);
        }
    }
    wait();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = threadIdx.x + r * blockDim.x;
        int which = t / half, i = t % half;
        int a = half_split ? i : 2 * i, b = half_split ? i + half : 2 * i + 1;
        if (t < n_rot) {
            const float* src = which < hb ? qkv + (h0 + which) * head_dim : ksrc;
            float* dst = which < hb ? qh + which * head_dim : kh;
            float x0 = __ldcg(src + a), x1 = __ldcg(src + b);
            dst[a] = x0 * c[r] - x1 * s[r];
            dst[b] = x0 * s[r] + x1 * c[r];
            // The half cache's k (and v below) as stored: p attends over its cache values.
            if (HALF && which == hb) sh.kh16[a] = f2h(dst[a]), sh.kh16[b] = f2h(dst[b]);
        } else if (t < n_rot + head_dim) {
            int j = t - n_rot;
            vh[j] = __ldcg(vsrc + j);
            if (HALF) sh.vh16[j] = f2h(vh[j]);
        }
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
        // A warp a block of 32 (two each where a grouped block of 16 warps has 24 or 32).
        for (int g = warp; g < hb * blocks; g += nw) quant_lane(qh[g * 32 + lane], h0 * blocks + g, xq, xd, xs);
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
    if (pdl != PDL_OFF) pdl_launch_next();
    // The position is fixed for the step (common.cuh, programmatic dependent launch): the plan
    // and the rotary embedding's angles are made before the wait, off the step's chain.
    int pos = state[1];
    auto wait = [&]() {
        pdl_wait();
        trace_mark(trace, trace_slot, TRACE_WAITED);
    };
    AttentionWork w = attention_work<CLUSTER>(pos, n_heads, n_kv_heads, max_slices, slice_positions,
                                              max_group_slices, group_from, cluster,
                                              cluster_slice, cluster_until);
    if (w.what == WORK_PREFETCH) {
        wait();
        prefetch_l2(pf, pf_lines, (blockIdx.x - w.items) * blockDim.x + threadIdx.x,
                    (gridDim.x - w.items) * blockDim.x);
        trace_mark(trace, trace_slot, TRACE_END);
        return;
    }
    if (w.what == WORK_IDLE) {
        wait();
        trace_mark(trace, trace_slot, TRACE_END);
        return;
    }
    float fk = w.cluster_join ? fk_cluster : w.hb > 1 ? fk_group : fk_head;
    // (The cluster kernel's one instantiation of attend, joining through L2 or in the cluster
    // as `cluster_join` says: a second would raise its registers into spills.)
    attend<KV, CLUSTER>(sh, w.h0, w.hb, w.slice, w.slices, qkv, n_heads, n_kv_heads, head_dim,
                        base, half_split, pos, kcache, vcache, kscales, vscales,
                        key_scale != nullptr, fk, xf, xq, apart, acount + w.unit, w.cluster_join,
                        wait);
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
