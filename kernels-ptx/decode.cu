// Decode kernels for one token of a llama-family model (llama, qwen2), in the order
// Engine::forward runs them on the CPU. Compiled by scripts/build-ptx.py with NVRTC 12.6 for
// compute_72, compute_87 and compute_90; the PTX is committed and embedded by build.rs.
//
// Conventions (firmware/engine/cuda.rs builds the arguments):
// - `state` is two ints in device memory: state[0] = the token to embed, state[1] = its
//   position. The step's last kernel (the logits product) writes the next greedy token and
//   advances the position, so a CUDA graph of one step can be replayed without the host
//   touching anything in between.
// - Matrices are stored struct-of-arrays per matrix (repacked at load from GGUF blocks, same
//   values): `q` = quants [rows][cols] for Q8_0, [rows][cols/2] nibbles for the 4-, 5- and 6-bit
//   types in the GGUF order of Q4_0 (byte j of a block of 32: value j low, value j+16 high), `d` =
//   f16 scale per block of 32, `m` = f16 min per block (Q4_1, Q5_1), `qh` = 32 high bits per block
//   (Q5_0, Q5_1; bit j = value j's); F16/F32 are plain rows. The K-quants keep their super-blocks
//   of 256 (8 blocks of 32) but for this nibble order (backend/cuda/kquant.rs): Q4_K and Q5_K `d`
//   = the super-block's 16 stored bytes of f16 d, f16 dmin and 12 bytes of 6-bit scales and mins,
//   Q5_K `qh` as Q5_0's; Q6_K `d` = f16 d per super-block, `m` = the block's two int8 scales (of
//   its values 0..15 and 16..31), `qh` = two words of high bit pairs per block (word h, byte i,
//   bits 2k..2k+1: value 16h + 4k + i's), so they take their stored bytes.
// - A product's input is prepared once, by the kernel before it, into global memory: `xf` =
//   the float vector (read by the f16/f32 kernels), and for the integer kernels `xq` = the
//   vector of width n as int8 blocks of 32: i8 q[n], then float d[n/32], then int sum[n/32]
//   (the layout is found from n alone). Quantized like the CPU (`quantize_q8` in
//   firmware/backend/cpu/matvec.rs): per block of 32, d = amax / 127, q = round(x * (1/d))
//   (half away from zero), and the block's integer sum, so both backends see the same int8
//   activations and differ only in the order of float sums.
// - Who prepares what: `embed` (RMSNorm for layer 0), `attention` (its output, per head), and
//   the last block to finish a product (`finish`): RMSNorm of the residual after wo and down,
//   SwiGLU after gate/up (or the block that finishes each tile of it), and the argmax after
//   the logits. A product's `finish` writes `fin_xf`/`fin_xq`, which are the product's own
//   input buffers but for SwiGLU: the down product's input has its own, because blocks of
//   gate/up that finish a tile write it while others still read their input.


#include "common.cuh"

enum { PREP_NORM = 1, PREP_SWIGLU = 2 };


// Prepares the next product's input from `src` (written earlier in this kernel, by any block:
// read through L2), by one whole block (blockDim a multiple of 32):
//   PREP_NORM:   xf = src / rms(src) * nw   (RMSNorm, eps)
//   PREP_SWIGLU: xf = silu(src[i]) * src[n + i]
// into xf when set, and, when xq is set, its int8 blocks. Latency rules here (one block, the
// rest of the GPU waits): each thread takes 4 values per 16-byte load, loops are unrolled so
// several loads are in flight, and a block of 32 is quantized by the 8 threads that hold it (3
// shuffles). A product kernel also calls it on its own input, into shared memory (`PREP`).
__device__ void prep_input(int mode, const float* src, const float* nw, int n, float eps,
                           float* xf, i8* xq) {
    __shared__ float shared32[32];
    bool vec = (n & 31) == 0;  // whole blocks of 32 (always so when xq is set)
    float inv = 1.0f;
    if (mode == PREP_NORM) {
        float ss = 0.0f;
        if (vec) {
#pragma unroll 4
            for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
                float4 v = __ldcg((const float4*)src + i);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        } else {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                float v = __ldcg(src + i);
                ss += v * v;
            }
        }
        ss = block_sum(ss, shared32);
        inv = 1.0f / sqrtf(ss / (float)n + eps);
    }
    if (!vec) {
        for (int i = threadIdx.x; i < n && xf; i += blockDim.x)
            xf[i] = mode == PREP_SWIGLU ? silu_mul(__ldcg(src + i), __ldcg(src + n + i))
                                        : __ldcg(src + i) * inv * nw[i];
        return;
    }
    float* xd = (float*)(xq + n);
    int* xs = (int*)(xd + n / 32);
    // Uniform trip count for the whole block, so every lane takes part in the shuffles.
#pragma unroll 4
    for (int base = 0; base < n / 4; base += blockDim.x) {
        int i = base + threadIdx.x;
        bool in = i < n / 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (in) {
            float4 a = __ldcg((const float4*)src + i);
            if (mode == PREP_SWIGLU) {
                float4 u = __ldcg((const float4*)(src + n) + i);
                v = make_float4(silu_mul(a.x, u.x), silu_mul(a.y, u.y), silu_mul(a.z, u.z),
                                silu_mul(a.w, u.w));
            } else {
                float4 w = __ldg((const float4*)nw + i);
                v = make_float4(a.x * inv * w.x, a.y * inv * w.y, a.z * inv * w.z, a.w * inv * w.w);
            }
            if (xf) ((float4*)xf)[i] = v;
        }
        if (xq) {
            // The 8 threads i & ~7 .. i | 7 hold one block of 32: quantize_q8 of the CPU.
            float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
            for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            int q0 = (int)roundf(v.x * id), q1 = (int)roundf(v.y * id);
            int q2 = (int)roundf(v.z * id), q3 = (int)roundf(v.w * id);
            int sum = q0 + q1 + q2 + q3;
            for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
            if (in) {
                ((int*)xq)[i] = (q0 & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | (q3 << 24);
                if ((i & 7) == 0) {
                    xd[i / 8] = d;
                    xs[i / 8] = sum;
                }
            }
        }
    }
}

// x = token_embd[state[0]], then the first layer's input RMSNorm(x, nw). One block.
extern "C" __global__ void embed(int type, const u8* q, const f16* d, const f16* m,
                                 const u32* qh, int dim, const int* state, float* x,
                                 const float* nw, float eps, float* xf, i8* xq, int pdl,
                                 unsigned long long* trace, int trace_slot) {
    trace_mark(trace, trace_slot, TRACE_START);
    pdl_start(pdl);
    trace_mark(trace, trace_slot, TRACE_WAITED);
    int tok = state[0];
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        x[c] = mat_value(type, q, d, m, qh, dim, tok, c);
    __syncthreads();
    prep_input(PREP_NORM, x, nw, dim, eps, xf, xq);
    trace_mark(trace, trace_slot, TRACE_END);
}

// --- matrix-vector products, `out[r] = (acc ? out[r] : 0) + W[r] . in + bias[r]`.
//
// A block of 256 threads is split into groups of `tpr` threads (a power of two, 8..256, chosen by
// the host from the row length); a group computes MV_R rows at once, so each load of the input
// serves MV_R rows. A unit is a block of 32 values for the integer types (16 or 32 bytes of
// quants in one or two 16-byte loads, the input's 32 int8 in two), 8 halves of an f16 row, 4
// floats of an f32 row. A thread takes UN units per round (1, or MV_WIDE in the `_wide`
// kernels; f32 rows one at a time), loading all their weights before it uses any. Integer
// kernels accumulate with dp4a and dequantize once per block of 32 (the weight scale times the
// input scale). The K-quants too take a block of 32 a unit, each the int8 input block it meets
// (as the CPU's kquant.rs): Q4_K/Q5_K's unit also loads its super-block's 16 bytes of scales
// (one load the 8 units of a super-block share through L1) and decodes its 6-bit scale and
// min; Q6_K's its two int8 scales (one per 16 values) and the super-block's d.
//
// After the product, `fin` says what the last block to finish prepares for the next kernel
// (see `finish`); `counter` counts finished blocks and is reset by the last one. `ahead` /
// `ahead_bytes` (sm_90; 0 = none) are the weights the blocks pull into L2 before they start
// (`prefetch_ahead`): the start of the next product's.

#define MV_THREADS 256
#define MV_R 2
// Units per round of a wide product (MV_WIDE in engine.rs).
#define MV_WIDE 4
// A product kernel's bounds. MV_BOUNDS_MIN(5) holds a kernel to 48 registers, so five blocks
// of it fit a multiprocessor rather than four at the 50-56 the compiler otherwise takes: the
// 1.5B shape's gate/up (560 blocks) is then one wave of an H100's 660 slots, not 528 and a
// tail. Given to the types whose kernels keep every value in registers at 48 (ptxas -v): not
// Q8_0 (its wide kernels spill there, and measured slower), nor the K-quants' (128-147
// registers), nor f16/f32 (under 48 already; naming a minimum changes their code).
#define MV_BOUNDS __launch_bounds__(MV_THREADS)
#define MV_BOUNDS_MIN(n) __launch_bounds__(MV_THREADS, n)

enum { FIN_NONE = 0, FIN_NORM = 1, FIN_SWIGLU = 2, FIN_ARGMAX = 3, FIN_SWIGLU_TILES = 4, FIN_SWIGLU_CLUSTER = 5 };

// Rows of one tile of a gate/up matrix stacked tile by tile (weights.rs, `gate_up_tiled`): 32
// of gate, then the same 32 of up.
#define SWIGLU_TILE 32

// Sum of v over the group of `tpr` threads; the group's first thread gets it.
__device__ __forceinline__ void group_sums(float* s, int tpr, float (*red)[MV_R]) {
#pragma unroll
    for (int k = 0; k < MV_R; k++) {
        int top = tpr < 32 ? tpr : 32;
        for (int o = top >> 1; o > 0; o >>= 1) s[k] += __shfl_xor_sync(0xffffffff, s[k], o);
    }
    if (tpr > 32) {
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < MV_R; k++) red[warp][k] = s[k];
        __syncthreads();
        if ((threadIdx.x & (tpr - 1)) == 0) {
            int nw = tpr >> 5;
#pragma unroll
            for (int k = 0; k < MV_R; k++) {
                float v = 0.0f;
                for (int w = 0; w < nw; w++) v += red[warp + w][k];
                s[k] = v;
            }
        }
    }
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Lane threadIdx.x (< 32) of SwiGLU tile `tile` from its gate and up rows: the output into xf
// and, with the other lanes, the tile's int8 block of xq (n values), as prep_input's SwiGLU.
__device__ __forceinline__ void swiglu_tile_out(float g, float u, int tile, int n, float* xf, i8* xq) {
    float v = silu_mul(g, u);
    if (xf) xf[tile * SWIGLU_TILE + threadIdx.x] = v;
    if (xq) {
        float* xd = (float*)(xq + n);
        quant_lane(v, tile, xq, xd, (int*)(xd + n / 32));
    }
}

// The epilogue after a product's rows are written: `best_v/best_i` = this thread's best row
// (FIN_ARGMAX, group leaders). Every block counts itself done; the last one prepares the next
// input from the whole output (FIN_NORM, FIN_SWIGLU), or picks the greedy token from every
// block's best (FIN_ARGMAX: two phases, no pass over the logits again).
// FIN_SWIGLU_TILES (gate/up stacked tile by tile): `counter` holds a count per tile instead.
// A block's rows lie in one tile (its 2 * 256 / tpr rows divide the tile's 64 and start at a
// multiple of them), so it adds its rows to that tile's count, and the block that completes
// the tile makes its 32 SwiGLU outputs and their int8 block with one warp, with the tail's
// arithmetic (silu_mul, quant_lane = prep_input's quantization): the same values, made by
// many blocks as they finish instead of by one block after all.
__device__ void finish(int fin, int tpr, float best_v, int best_i, const float* src,
                       const float* nw, int n, float eps, float* xf, i8* xq, unsigned* counter,
                       float* part, int* state, volatile int* host_tokens) {
    __shared__ float bv[MV_THREADS];
    __shared__ int bi[MV_THREADS];
    __shared__ int last;
    if (fin == FIN_NONE) return;
    if (fin == FIN_SWIGLU_TILES) {
        int rows_here = MV_THREADS / tpr * MV_R, tile = blockIdx.x * rows_here / (2 * SWIGLU_TILE);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            last = atomicAdd(counter + tile, (unsigned)rows_here) == 2 * SWIGLU_TILE - rows_here;
        __syncthreads();
        if (!last || threadIdx.x >= 32) return;
        __threadfence();
        if (threadIdx.x == 0) counter[tile] = 0;  // for the next layer
        const float* g = src + tile * 2 * SWIGLU_TILE;
        swiglu_tile_out(__ldcg(g + threadIdx.x), __ldcg(g + SWIGLU_TILE + threadIdx.x), tile, n, xf, xq);
        return;
    }
    int* part_i = (int*)(part + gridDim.x);
    if (fin == FIN_ARGMAX) {
        int groups = MV_THREADS / tpr, g = threadIdx.x / tpr;
        if ((threadIdx.x & (tpr - 1)) == 0) {
            bv[g] = best_v;
            bi[g] = best_i;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = bv[0];
            int i = bi[0];
            for (int k = 1; k < groups; k++)
                if (better(bv[k], bi[k], v, i)) { v = bv[k]; i = bi[k]; }
            part[blockIdx.x] = v;
            part_i[blockIdx.x] = i;
        }
    }
    // Writes of this block (rows, partials) are visible device-wide before it counts itself.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *counter = 0;  // for the next product
    if (fin != FIN_ARGMAX) {
        prep_input(fin == FIN_NORM ? PREP_NORM : PREP_SWIGLU, src, nw, n, eps, xf, xq);
        return;
    }
    float v = NEG_INF;
    int i = 0x7fffffff;
    for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        float ov = __ldcg(part + b);
        int oi = __ldcg(part_i + b);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    bv[threadIdx.x] = v;
    bi[threadIdx.x] = i;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(bv[threadIdx.x + s], bi[threadIdx.x + s], bv[threadIdx.x], bi[threadIdx.x])) {
            bv[threadIdx.x] = bv[threadIdx.x + s];
            bi[threadIdx.x] = bi[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (host_tokens) host_tokens[state[1]] = bi[0];
        state[0] = bi[0];
        state[1] += 1;
    }
}

// FIN_SWIGLU_CLUSTER (gate/up stacked tile by tile, launched as clusters of the blocks of one
// tile: 64 / (2 * 256 / tpr) of them, sm_90): each block's rows were pushed into `tile_rows` of
// the tile's first block (cluster rank 0) as they were written; after the cluster's barrier
// that block's first warp makes the tile's 32 SwiGLU outputs and their int8 block, with
// FIN_SWIGLU_TILES' arithmetic. No fence, no count, no read back from L2.
__device__ void swiglu_cluster_tail(const float* tile_rows, int tpr, int n, float* xf, i8* xq) {
    cluster_sync();
    if (cluster_rank() != 0 || threadIdx.x >= 32) return;
    int tile = blockIdx.x * (MV_THREADS / tpr * MV_R) / (2 * SWIGLU_TILE);
    swiglu_tile_out(tile_rows[threadIdx.x], tile_rows[SWIGLU_TILE + threadIdx.x], tile, n, xf, xq);
}

__device__ __forceinline__ int dp4a_lo(u32 w, int a, int acc) {
    return __dp4a((int)(w & 0x0F0F0F0F), a, acc);
}
__device__ __forceinline__ int dp4a_hi(u32 w, int a, int acc) {
    return __dp4a((int)((w >> 4) & 0x0F0F0F0F), a, acc);
}

// Spreads 4 bits (b0..b3) to bit 4 of each byte.
__device__ __forceinline__ int high_bits(u32 four) {
    return (int)(((four & 1) << 4) | ((four & 2) << 11) | ((four & 4) << 18) | ((four & 8) << 25));
}

// The weights of one unit of a row: a thread loads all of its units' weights (UN units x MV_R
// rows) before it uses any, so those loads are in flight together.
struct WUnit {
    int4 w0, w1;  // Q8_0: 32 bytes; the 4-bit types: 16 bytes in w0 (K-quants: w1 below)
    float d, m;
    u32 h;
    int g;        // Q4_K, Q5_K: the block's place in its super-block (0..7)
};

template <int TY>
__device__ __forceinline__ WUnit unit_load(const u8* __restrict__ q, const f16* __restrict__ d,
                                           const f16* __restrict__ m, const u32* __restrict__ qh,
                                           size_t nb, int r, int u) {
    size_t b = (size_t)r * nb + u;
    WUnit w;
    w.w1 = make_int4(0, 0, 0, 0);
    w.g = 0;
    w.d = w.m = 0.0f;
    w.h = 0u;
    if (TY == T_Q8_0) {
        w.w0 = __ldg((const int4*)(q + b * 32));
        w.w1 = __ldg((const int4*)(q + b * 32) + 1);
    } else {
        w.w0 = __ldg((const int4*)(q + b * 16));
    }
    if (TY == T_Q4_K || TY == T_Q5_K) {
        // The super-block's 16 bytes (d, dmin, scales), shared by its 8 blocks (rows hold whole
        // super-blocks, so b / 8 is it and b % 8 the block's place), decoded in unit_dot.
        w.w1 = __ldg((const int4*)d + (b >> 3));
        w.g = (int)(b & 7);
    } else if (TY == T_Q6_K) {
        uint2 hp = __ldg((const uint2*)qh + b);
        w.w1.x = (int)hp.x;
        w.w1.y = (int)hp.y;
        w.w1.z = (int)__ldg((const unsigned short*)m + b);
        w.d = h2f(__ldg(d + (b >> 3)));
    } else {
        w.d = h2f(__ldg(d + b));
    }
    if (TY == T_Q4_1 || TY == T_Q5_1) w.m = h2f(__ldg(m + b));
    if (TY == T_Q5_0 || TY == T_Q5_1 || TY == T_Q5_K) w.h = __ldg(qh + b);
    return w;
}

// Dot product of a unit's weights with the input unit (a0, a1 = its 32 int8), as a float scaled
// by the weights' per-block factor times the input scale xd (xs = the input block's integer
// sum, for the offset and min terms).
template <int TY>
__device__ __forceinline__ float unit_dot(const WUnit& w, int4 a0, int4 a1, float xd, int xs) {
    if (TY == T_Q8_0) {
        int i = __dp4a(w.w0.x, a0.x, 0);
        i = __dp4a(w.w0.y, a0.y, i);
        i = __dp4a(w.w0.z, a0.z, i);
        i = __dp4a(w.w0.w, a0.w, i);
        i = __dp4a(w.w1.x, a1.x, i);
        i = __dp4a(w.w1.y, a1.y, i);
        i = __dp4a(w.w1.z, a1.z, i);
        i = __dp4a(w.w1.w, a1.w, i);
        return w.d * xd * (float)i;
    } else if (TY == T_Q6_K) {
        // Values 0..15 (low nibbles of the 4 words) and 16..31 (high nibbles), each byte with
        // its high bit pair at bits 4-5 and then minus 32 (a signed byte: no borrow crosses
        // bytes, as each is biased by 128 first). Then, as the CPU: d * d_x * (sc_0 * dot of
        // the first 16 + sc_1 * dot of the last 16).
        u32 lo[4] = {(u32)w.w0.x, (u32)w.w0.y, (u32)w.w0.z, (u32)w.w0.w};
        int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        int i0 = 0, i1 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 v0 = (lo[k] & 0x0F0F0F0F) | ((((u32)w.w1.x >> (2 * k)) & 0x03030303) << 4);
            u32 v1 = ((lo[k] >> 4) & 0x0F0F0F0F) | ((((u32)w.w1.y >> (2 * k)) & 0x03030303) << 4);
            v0 = ((v0 | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
            v1 = ((v1 | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
            i0 = __dp4a((int)v0, a[k], i0);
            i1 = __dp4a((int)v1, a[4 + k], i1);
        }
        int sc0 = (int)(i8)(w.w1.z & 0xff), sc1 = (int)(i8)((w.w1.z >> 8) & 0xff);
        return w.d * xd * (float)(sc0 * i0 + sc1 * i1);
    } else {
        // Word k of the 16 bytes: values 4k..4k+3 (low nibbles), 16+4k..16+4k+3 (high).
        u32 lx = w.w0.x, ly = w.w0.y, lz = w.w0.z, lw = w.w0.w;
        u32 hx = lx >> 4, hy = ly >> 4, hz = lz >> 4, hw = lw >> 4;
        lx &= 0x0F0F0F0F; ly &= 0x0F0F0F0F; lz &= 0x0F0F0F0F; lw &= 0x0F0F0F0F;
        hx &= 0x0F0F0F0F; hy &= 0x0F0F0F0F; hz &= 0x0F0F0F0F; hw &= 0x0F0F0F0F;
        if (TY == T_Q5_0 || TY == T_Q5_1 || TY == T_Q5_K) {
            u32 h = w.h;
            lx |= high_bits(h); ly |= high_bits(h >> 4); lz |= high_bits(h >> 8); lw |= high_bits(h >> 12);
            hx |= high_bits(h >> 16); hy |= high_bits(h >> 20); hz |= high_bits(h >> 24); hw |= high_bits(h >> 28);
        }
        int i = __dp4a((int)lx, a0.x, 0);
        i = __dp4a((int)ly, a0.y, i);
        i = __dp4a((int)lz, a0.z, i);
        i = __dp4a((int)lw, a0.w, i);
        i = __dp4a((int)hx, a1.x, i);
        i = __dp4a((int)hy, a1.y, i);
        i = __dp4a((int)hz, a1.z, i);
        i = __dp4a((int)hw, a1.w, i);
        if (TY == T_Q4_K || TY == T_Q5_K) {
            // As the CPU (backend/cpu/matvec/kquant.rs): d * sc * d_x * dot - dmin * m * s_x.
            int sc, mn;
            k4_scale_min((u32)w.w1.y, (u32)w.w1.z, (u32)w.w1.w, w.g, sc, mn);
            float dd = h2f((u32)w.w1.x & 0xffff), dmin = h2f((u32)w.w1.x >> 16);
            return dd * (float)sc * xd * (float)i - dmin * (float)mn * (xd * (float)xs);
        }
        if (TY == T_Q4_0) i -= 8 * xs;
        if (TY == T_Q5_0) i -= 16 * xs;
        float s = w.d * xd * (float)i;
        if (TY == T_Q4_1 || TY == T_Q5_1) s += w.m * (xd * (float)xs);
        return s;
    }
}

// An f16 unit (8 halves, 16 bytes, loaded) times 8 input floats.
__device__ __forceinline__ float f16_dot8(uint4 p, float4 a, float4 b) {
    float s = h2f(p.x & 0xffff) * a.x + h2f(p.x >> 16) * a.y;
    s += h2f(p.y & 0xffff) * a.z + h2f(p.y >> 16) * a.w;
    s += h2f(p.z & 0xffff) * b.x + h2f(p.z >> 16) * b.y;
    s += h2f(p.w & 0xffff) * b.z + h2f(p.w >> 16) * b.w;
    return s;
}

#define MV_ARGS                                                                           \
    const u8 *__restrict__ q, const f16 *__restrict__ d, const f16 *__restrict__ m,       \
        const u32 *__restrict__ qh, int rows, int cols, int tpr, float *xf,                  \
        i8 *xq, float *out, const float *bias, int acc, int fin, const float *fin_src,    \
        const float *fin_nw, int fin_n, float *fin_xf, i8 *fin_xq, float eps,             \
        unsigned *counter, float *part,                                                   \
        int *state, volatile int *host_tokens, const float *prep_src, const float *prep_nw, int pdl, \
        const u8 *ahead, unsigned ahead_bytes, unsigned long long *trace, int trace_slot

// UN = units a thread takes per round of loads. Narrow (UN 1, about one unit per thread, many
// short blocks) suits the small products, where a step is a chain of short kernels; wide (UN
// 4, a quarter of the threads per row) suits the big ones, where the bytes in flight per thread
// decide how much of the bandwidth is used. The host picks per product (engine.rs,
// `mv_config`).
// A weight load that stays where it is written (volatile asm): the f16 loop's first round must
// be issued before the in-block norm, and the compiler otherwise sinks it past the norm.
__device__ __forceinline__ uint4 ldg_issue(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// An activation load: from global memory through the read-only path, or from this block's own
// prepared copy in shared memory (PREP), which __ldg must not be given.
template <bool SH, typename T>
__device__ __forceinline__ T ldx(const T* p) {
    if (SH) return *p;
    return __ldg(p);
}

// PREP: the block first prepares its own input, RMSNorm(prep_src) * prep_nw over `cols` values
// (and their int8 blocks for the integer types), into dynamic shared memory, with the code and
// arithmetic of the tail that otherwise does it once for all (`prep_input`), so the results are
// the same; the product before then needs no tail. A narrow kernel whose rows are in whole
// units first issues its first round of weight loads, so the norm runs while they are in
// flight (measured: +3-5% at the SmolLM2 and 0.5B shapes; in the wide kernels, which hold four
// times the registers across the norm, it cost 7-9% at the 1.5B shape, so they norm first).
template <int TY, int UN, bool PREP>
__device__ void matvec(MV_ARGS) {
    __shared__ float red[MV_THREADS / 32][MV_R];
    extern __shared__ __align__(16) unsigned char prep_smem[];
    trace_mark(trace, trace_slot, TRACE_START);
    // The product's input: xf/xq, or the block's own copy in shared memory (PREP).
    const float* in_f = xf;
    const i8* in_q = xq;
    bool floats = TY == T_F16 || TY == T_F32;
    // The loops below that preload their first round call this after the loads.
    auto prep = [&]() {
        pdl_wait();
        trace_mark(trace, trace_slot, TRACE_WAITED);
        prep_input(PREP_NORM, prep_src, prep_nw, cols, eps, floats ? (float*)prep_smem : nullptr,
                   floats ? nullptr : (i8*)prep_smem);
        __syncthreads();
        in_f = (const float*)prep_smem;
        in_q = (const i8*)prep_smem;
    };
    constexpr bool PRELOAD = PREP && UN == 1;
    // Rows in whole units (the loops below that load a round at a time).
    bool units = TY != T_F32 && (TY != T_F16 || (cols & 7) == 0);
    bool preload = PRELOAD && units;
    int t = threadIdx.x & (tpr - 1);
    int r0 = (blockIdx.x * (MV_THREADS / tpr) + threadIdx.x / tpr) * MV_R;
    int rr[MV_R];
#pragma unroll
    for (int k = 0; k < MV_R; k++) rr[k] = min(r0 + k, rows - 1);  // rows past the end: loads only
    // Launched before the kernel before has finished (pdl): let the next one launch too, and
    // with PDL_PREFETCH pull this thread's first round of weights (the loops' first `load`)
    // into L2 while waiting. The wait is in `prep`, or here without one; a preloading loop
    // issues its first loads (into registers) before it, `prep` after them.
    if (pdl != PDL_OFF) pdl_launch_next();
    prefetch_ahead(ahead, ahead_bytes);
    if (pdl == PDL_PREFETCH && units) {
        int nu = TY == T_F16 ? cols / 8 : cols / 32;
        int ub = TY == T_Q8_0 ? 32 : 16;  // bytes of a unit's quants (f16: 8 halves)
#pragma unroll
        for (int j = 0; j < UN; j++)
#pragma unroll
            for (int k = 0; k < MV_R; k++) {
                size_t b = (size_t)rr[k] * nu + min(t + j * tpr, nu - 1);
                prefetch_line(q + b * ub);
                if (TY != T_F16) prefetch_line(d + b);
            }
    }
    if (!PREP) {
        pdl_wait();
        trace_mark(trace, trace_slot, TRACE_WAITED);
    }
    if (PREP && !preload) prep();
    float s[MV_R];
#pragma unroll
    for (int k = 0; k < MV_R; k++) s[k] = 0.0f;

    if (TY == T_F16 && (cols & 7) == 0) {
        int nu = cols / 8;
        uint4 w[MV_R][UN];
        auto load = [&](int u0) {
#pragma unroll
            for (int j = 0; j < UN; j++) {
                int u = min(u0 + j * tpr, nu - 1);
#pragma unroll
                for (int k = 0; k < MV_R; k++) {
                    const uint4* p = (const uint4*)((const f16*)q + (size_t)rr[k] * cols) + u;
                    w[k][j] = PRELOAD ? ldg_issue(p) : __ldg(p);
                }
            }
        };
        if (PRELOAD) {
            load(t);
            prep();
        }
        const float4* x4 = (const float4*)in_f;
        for (int u0 = t; u0 < nu; u0 += UN * tpr) {
            // Branch-free: a unit past the row's end loads the row's last unit and counts zero,
            // so every load of the round is issued before the first use.
            float4 a[UN], b[UN];
            if (!PRELOAD || u0 != t) load(u0);
#pragma unroll
            for (int j = 0; j < UN; j++) {
                int u = min(u0 + j * tpr, nu - 1);
                a[j] = ldx<PREP>(x4 + 2 * u);
                b[j] = ldx<PREP>(x4 + 2 * u + 1);
            }
#pragma unroll
            for (int j = 0; j < UN; j++) {
                bool ok = u0 + j * tpr < nu;
#pragma unroll
                for (int k = 0; k < MV_R; k++) {
                    float v = f16_dot8(w[k][j], a[j], b[j]);
                    s[k] += ok ? v : 0.0f;
                }
            }
        }
    } else if (TY == T_F16 || TY == T_F32) {
        const float4* x4 = (const float4*)in_f;
        if (TY == T_F32 && (cols & 3) == 0) {
#pragma unroll 2
            for (int u = t; u < cols / 4; u += tpr) {
                float4 a = ldx<PREP>(x4 + u);
#pragma unroll
                for (int k = 0; k < MV_R; k++) {
                    float4 w = __ldg((const float4*)((const float*)q + (size_t)rr[k] * cols) + u);
                    s[k] += w.x * a.x + w.y * a.y + w.z * a.z + w.w * a.w;
                }
            }
        } else {
            for (int c = t; c < cols; c += tpr) {
                float a = ldx<PREP>(in_f + c);
#pragma unroll
                for (int k = 0; k < MV_R; k++) {
                    size_t at = (size_t)rr[k] * cols + c;
                    float w = TY == T_F16 ? h2f(__ldg((const f16*)q + at)) : __ldg((const float*)q + at);
                    s[k] += w * a;
                }
            }
        }
    } else {
        int nb = cols >> 5;
        WUnit w[MV_R][UN];
        auto load = [&](int u0) {
#pragma unroll
            for (int j = 0; j < UN; j++) {
                int u = min(u0 + j * tpr, nb - 1);
#pragma unroll
                for (int k = 0; k < MV_R; k++) w[k][j] = unit_load<TY>(q, d, m, qh, nb, rr[k], u);
            }
        };
        if (PRELOAD) {
            load(t);
            prep();
        }
        const int4* x4 = (const int4*)in_q;
        const float* xd = (const float*)(in_q + cols);
        const int* xs = (const int*)(xd + nb);
        for (int u0 = t; u0 < nb; u0 += UN * tpr) {
            // Branch-free as the f16 loop: all loads first, units past the end count zero.
            int4 a0[UN], a1[UN];
            float dx[UN];
            int sx[UN];
            if (!PRELOAD || u0 != t) load(u0);
#pragma unroll
            for (int j = 0; j < UN; j++) {
                int u = min(u0 + j * tpr, nb - 1);
                a0[j] = ldx<PREP>(x4 + 2 * u);
                a1[j] = ldx<PREP>(x4 + 2 * u + 1);
                dx[j] = ldx<PREP>(xd + u);
                sx[j] = TY == T_Q8_0 || TY == T_Q6_K ? 0 : ldx<PREP>(xs + u);
            }
#pragma unroll
            for (int j = 0; j < UN; j++) {
                bool ok = u0 + j * tpr < nb;
#pragma unroll
                for (int k = 0; k < MV_R; k++) {
                    float v = unit_dot<TY>(w[k][j], a0[j], a1[j], dx[j], sx[j]);
                    s[k] += ok ? v : 0.0f;
                }
            }
        }
    }

    group_sums(s, tpr, red);
    // The tile's rows (FIN_SWIGLU_CLUSTER, `_prep` kernels only: gate/up norms in each block
    // wherever it runs as clusters), in the shared memory of its first block.
    __shared__ __align__(16) float tile_rows[2 * SWIGLU_TILE];
    float best_v = NEG_INF;
    int best_i = 0x7fffffff;
    if (t == 0) {
#pragma unroll
        for (int k = 0; k < MV_R; k++) {
            int r = r0 + k;
            if (r < rows) {
                float v = s[k] + (bias ? bias[r] : 0.0f);
                if (acc) v += out[r];
                out[r] = v;
                if (PREP && fin == FIN_SWIGLU_CLUSTER) st_cluster(&tile_rows[r % (2 * SWIGLU_TILE)], 0, v);
                if (better(v, r, best_v, best_i)) { best_v = v; best_i = r; }
            }
        }
    }
    if (PREP && fin == FIN_SWIGLU_CLUSTER)
        swiglu_cluster_tail(tile_rows, tpr, fin_n, fin_xf, fin_xq);
    else
        finish(fin, tpr, best_v, best_i, fin_src, fin_nw, fin_n, eps, fin_xf, fin_xq, counter, part,
               state, host_tokens);
    trace_mark(trace, trace_slot, TRACE_END);
}

#define MV_PASS q, d, m, qh, rows, cols, tpr, xf, xq, out, bias, acc, fin, fin_src, fin_nw, fin_n, \
                fin_xf, fin_xq, eps, counter, part, state, host_tokens, prep_src, prep_nw, pdl, \
                ahead, ahead_bytes, trace, trace_slot
// The exported product kernels: each type narrow and (but f32) wide, each also as `_prep`
// (PREP: the block norms its own input). engine.rs finds them by these names.
#define MV_EXPORT(NAME, TY, UN, BOUNDS)                                                            \
    extern "C" __global__ void BOUNDS matvec_##NAME(MV_ARGS) {                                       \
        matvec<TY, UN, false>(MV_PASS);                                                           \
    }                                                                                             \
    extern "C" __global__ void BOUNDS matvec_##NAME##_prep(MV_ARGS) {                                 \
        matvec<TY, UN, true>(MV_PASS);                                                            \
    }
MV_EXPORT(f32, T_F32, 1, MV_BOUNDS)
MV_EXPORT(f16, T_F16, 1, MV_BOUNDS)
MV_EXPORT(q8_0, T_Q8_0, 1, MV_BOUNDS)
MV_EXPORT(q4_0, T_Q4_0, 1, MV_BOUNDS_MIN(5))
MV_EXPORT(q4_1, T_Q4_1, 1, MV_BOUNDS_MIN(5))
MV_EXPORT(q5_0, T_Q5_0, 1, MV_BOUNDS_MIN(5))
MV_EXPORT(q5_1, T_Q5_1, 1, MV_BOUNDS_MIN(5))
MV_EXPORT(q4_k, T_Q4_K, 1, MV_BOUNDS)
MV_EXPORT(q5_k, T_Q5_K, 1, MV_BOUNDS)
MV_EXPORT(q6_k, T_Q6_K, 1, MV_BOUNDS)
MV_EXPORT(f16_wide, T_F16, MV_WIDE, MV_BOUNDS)
MV_EXPORT(q8_0_wide, T_Q8_0, MV_WIDE, MV_BOUNDS)
MV_EXPORT(q4_0_wide, T_Q4_0, MV_WIDE, MV_BOUNDS_MIN(5))
MV_EXPORT(q4_1_wide, T_Q4_1, MV_WIDE, MV_BOUNDS_MIN(5))
MV_EXPORT(q5_0_wide, T_Q5_0, MV_WIDE, MV_BOUNDS_MIN(5))
MV_EXPORT(q5_1_wide, T_Q5_1, MV_WIDE, MV_BOUNDS_MIN(5))
MV_EXPORT(q4_k_wide, T_Q4_K, MV_WIDE, MV_BOUNDS)
MV_EXPORT(q5_k_wide, T_Q5_K, MV_WIDE, MV_BOUNDS)
MV_EXPORT(q6_k_wide, T_Q6_K, MV_WIDE, MV_BOUNDS_MIN(5))

#include "attention.cuh"

// The streamed FFN's way back into the step (engine/cuda/stream.rs): x += a (+ b, when set),
// then the next product's input RMSNorm(x, nw) into xf (and its int8 blocks into xq, when
// set). `a` is the streamed layer's output, `b` its dropped neurons' mean contribution. One
// block.
extern "C" __global__ void add_norm(float* x, const float* a, const float* b, int dim,
                                    const float* nw, float eps, float* xf, i8* xq) {
    for (int c = threadIdx.x; c < dim; c += blockDim.x) x[c] += a[c] + (b ? b[c] : 0.0f);
    __syncthreads();
    prep_input(PREP_NORM, x, nw, dim, eps, xf, xq);
}
