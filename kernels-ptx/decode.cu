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
                                 const float* nw, float eps, float* xf, i8* xq, int pdl) {
    pdl_start(pdl);
    int tok = state[0];
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        x[c] = mat_value(type, q, d, m, qh, dim, tok, c);
    __syncthreads();
    prep_input(PREP_NORM, x, nw, dim, eps, xf, xq);
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
// (see `finish`); `counter` counts finished blocks and is reset by the last one.

#define MV_THREADS 256
#define MV_R 2
// Units per round of a wide product (MV_WIDE in engine.rs).
#define MV_WIDE 4

enum { FIN_NONE = 0, FIN_NORM = 1, FIN_SWIGLU = 2, FIN_ARGMAX = 3, FIN_SWIGLU_TILES = 4 };

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
        float v = silu_mul(__ldcg(g + threadIdx.x), __ldcg(g + SWIGLU_TILE + threadIdx.x));
        if (xf) xf[tile * SWIGLU_TILE + threadIdx.x] = v;
        if (xq) {
            float* xd = (float*)(xq + n);
            quant_lane(v, tile, xq, xd, (int*)(xd + n / 32));
        }
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
        int *state, volatile int *host_tokens, const float *prep_src, const float *prep_nw, int pdl

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
    // The product's input: xf/xq, or the block's own copy in shared memory (PREP).
    const float* in_f = xf;
    const i8* in_q = xq;
    bool floats = TY == T_F16 || TY == T_F32;
    // The loops below that preload their first round call this after the loads.
    auto prep = [&]() {
        pdl_wait();
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
    if (!PREP) pdl_wait();
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
                if (better(v, r, best_v, best_i)) { best_v = v; best_i = r; }
            }
        }
    }
    finish(fin, tpr, best_v, best_i, fin_src, fin_nw, fin_n, eps, fin_xf, fin_xq, counter, part, state,
           host_tokens);
}

#define MV_PASS q, d, m, qh, rows, cols, tpr, xf, xq, out, bias, acc, fin, fin_src, fin_nw, fin_n, \
                fin_xf, fin_xq, eps, counter, part, state, host_tokens, prep_src, prep_nw, pdl
// The exported product kernels: each type narrow and (but f32) wide, each also as `_prep`
// (PREP: the block norms its own input). engine.rs finds them by these names.
#define MV_EXPORT(NAME, TY, UN)                                                                   \
    extern "C" __global__ void __launch_bounds__(MV_THREADS) matvec_##NAME(MV_ARGS) {             \
        matvec<TY, UN, false>(MV_PASS);                                                           \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_THREADS) matvec_##NAME##_prep(MV_ARGS) {      \
        matvec<TY, UN, true>(MV_PASS);                                                            \
    }
MV_EXPORT(f32, T_F32, 1)
MV_EXPORT(f16, T_F16, 1)
MV_EXPORT(q8_0, T_Q8_0, 1)
MV_EXPORT(q4_0, T_Q4_0, 1)
MV_EXPORT(q4_1, T_Q4_1, 1)
MV_EXPORT(q5_0, T_Q5_0, 1)
MV_EXPORT(q5_1, T_Q5_1, 1)
MV_EXPORT(q4_k, T_Q4_K, 1)
MV_EXPORT(q5_k, T_Q5_K, 1)
MV_EXPORT(q6_k, T_Q6_K, 1)
MV_EXPORT(f16_wide, T_F16, MV_WIDE)
MV_EXPORT(q8_0_wide, T_Q8_0, MV_WIDE)
MV_EXPORT(q4_0_wide, T_Q4_0, MV_WIDE)
MV_EXPORT(q4_1_wide, T_Q4_1, MV_WIDE)
MV_EXPORT(q5_0_wide, T_Q5_0, MV_WIDE)
MV_EXPORT(q5_1_wide, T_Q5_1, MV_WIDE)
MV_EXPORT(q4_k_wide, T_Q4_K, MV_WIDE)
MV_EXPORT(q5_k_wide, T_Q5_K, MV_WIDE)
MV_EXPORT(q6_k_wide, T_Q6_K, MV_WIDE)

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

// The float cache's pass over positions [t_begin, t_end) (attend's float path), for warp `warp`
// of the `nw` that share the head's positions: scores, online softmax and weighted values, left
// in `wo` (head_dim floats) with the warp's max `m` and sum `l`. A lane takes R float4s of a row
// (j = lane, lane + 32: heads of up to 128 * R), the warp reduces each dot with shuffles, and a
// round takes NP positions whose loads are all in flight before any is used: at long context
// a warp's rounds, each a wait on memory, are attention's time, so a round takes as many
// positions as the registers allow (NP 4 for heads of 128, 2 for 256).
template <int R, int NP>
__device__ void attend_f32_loop(int t_begin, int t_end, int pos, int head_dim, int kv_dim,
                                int kvh, float scale, const float* kcache, const float* vcache,
                                const float* q, const float* kh, const float* vh, int warp,
                                int nw, float& m, float& l, float* wo) {
    int lane = threadIdx.x & 31, n4 = head_dim / 4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 qv[R], o[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int j = lane + 32 * r;
        qv[r] = j < n4 ? ((const float4*)q)[j] : zero;
        o[r] = zero;
    }
    // Row t of the kv head's keys or values as float4s: the cache, or for t = pos the shared copy.
    auto row4 = [&](const float* cache, const float* mine, int t) -> const float4* {
        return t == pos ? (const float4*)mine
                        : (const float4*)(cache + (size_t)t * kv_dim + kvh * head_dim);
    };
    for (int t0 = t_begin + warp; t0 < t_end; t0 += NP * nw) {
        float4 kr[NP][R], vr[NP][R];
        bool ok[NP];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            int t = t0 + p * nw;
            ok[p] = t < t_end;
            t = ok[p] ? t : t0;  // a position past the end loads t0's row again, and counts nothing
            const float4 *k = row4(kcache, kh, t), *v = row4(vcache, vh, t);
#pragma unroll
            for (int r = 0; r < R; r++) {
                int j = lane + 32 * r;
                kr[p][r] = j < n4 ? k[j] : zero;
                vr[p][r] = j < n4 ? v[j] : zero;
            }
        }
        float s[NP];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            s[p] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++)
                s[p] += qv[r].x * kr[p][r].x + qv[r].y * kr[p][r].y + qv[r].z * kr[p][r].z +
                        qv[r].w * kr[p][r].w;
        }
        // The NP dots reduced together, so their shuffles overlap.
#pragma unroll
        for (int x = 16; x > 0; x >>= 1)
#pragma unroll
            for (int p = 0; p < NP; p++) s[p] += __shfl_xor_sync(0xffffffff, s[p], x);
        float mn = m;
#pragma unroll
        for (int p = 0; p < NP; p++) {
            s[p] = ok[p] ? s[p] * scale : NEG_INF;
            mn = fmaxf(mn, s[p]);
        }
        float c = expf(m - mn);  // 0 on the first round (m = -inf, mn finite: t0 < t_end)
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
            float w = ok[p] ? expf(s[p] - mn) : 0.0f;
            l += w;
#pragma unroll
            for (int r = 0; r < R; r++) {
                o[r].x += w * vr[p][r].x;
                o[r].y += w * vr[p][r].y;
                o[r].z += w * vr[p][r].z;
                o[r].w += w * vr[p][r].w;
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

// The last block of a split attention joins the `slices` parts (max, sum, unscaled values; in
// `apart`, `attend`'s layout) of each of its `hb` heads h0.. into the output xf and `out` (hb *
// head_dim floats). Latency rules: a join of many slices is on the step's chain, so each part's
// max and sum are loaded by a thread of their own, a warp a head folds them from shared memory
// (`scratch`: hb * slices floats), and each output element's loads are unrolled to be in
// flight together.
__device__ void join_slices(int h0, int hb, int slices, int head_dim, const float* apart,
                            float* scratch, float* head_sum, float* xf, float* out) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int stride = head_dim + 2;
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
template <bool I8>
__device__ void attend(int h0, int hb, int slice, int slices, const float* qkv, int n_heads,
                       int n_kv_heads, int head_dim, float base, int half_split, int pos,
                       float* kcache, float* vcache, float* kscales, float* vscales,
                       bool key_scaled, float fk, float* xf, i8* xq, float* apart,
                       unsigned* acount) {
    __shared__ __align__(16) float qh[1024], kh[256], vh[256];
    // The int8 path's queries, key and value of p (int8, and their group scales).
    __shared__ __align__(16) i8 qq[1024], kq[256], vq[256];
    __shared__ float qd[32], kd[8], vd[8];
    __shared__ __align__(16) float warp_o[32][256];
    __shared__ float warp_m[32], warp_l[32];
    __shared__ int last;
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
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) vh[i] = __ldcg(vsrc + i);
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
    } else {
        float* krow = kcache + (size_t)pos * kv_dim + kvh * head_dim;
        float* vrow = vcache + (size_t)pos * kv_dim + kvh * head_dim;
        if (h0 % group == 0 && slice == 0)
            for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
                krow[i] = kh[i];
                vrow[i] = vh[i];
            }
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
        const float* q = qh + hi * head_dim;
        if (head_dim <= 128)
            attend_f32_loop<1, 4>(t_begin, t_end, pos, head_dim, kv_dim, kvh, scale, kcache,
                                  vcache, q, kh, vh, wi, wph, m, l, warp_o[warp]);
        else
            attend_f32_loop<2, 2>(t_begin, t_end, pos, head_dim, kv_dim, kvh, scale, kcache,
                                  vcache, q, kh, vh, wi, wph, m, l, warp_o[warp]);
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
    __syncthreads();
    // Join each head's warps: each output element rescales the head's warps' parts to their max.
    for (int i = threadIdx.x; i < hb * head_dim; i += blockDim.x) {
        int e = i / head_dim, d = i % head_dim, w0 = e * wph;
        float mx = NEG_INF;
        for (int w = w0; w < w0 + wph; w++) mx = fmaxf(mx, warp_m[w]);
        float sum = 0.0f, acc = 0.0f;
        for (int w = w0; w < w0 + wph; w++) {
            if (warp_m[w] == NEG_INF) continue;  // a warp that had no position
            float f = expf(warp_m[w] - mx);
            sum += warp_l[w] * f;
            acc += warp_o[w][d] * f;
        }
        if (slices == 1) {
            xf[(h0 + e) * head_dim + d] = acc / sum;
            qh[i] = acc / sum;  // q is no longer needed: the output, for quantizing
        } else {
            float* part = apart + (size_t)((h0 + e) * slices + slice) * (head_dim + 2);
            part[2 + d] = acc;
            if (d == 0) {
                part[0] = mx;
                part[1] = sum;
            }
        }
    }
    if (slices > 1) {
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

template <bool I8>
__device__ void attention_launch(const float* qkv, int n_heads, int n_kv_heads, int head_dim,
                                 float base, int half_split, const int* state, float* kcache,
                                 float* vcache, float* kscales, float* vscales,
                                 const float* key_scale, float* xf, i8* xq, const u8* pf,
                                 int pf_lines, float* apart, unsigned* acount, int max_slices,
                                 int slice_positions, int max_group_slices, int group_from,
                                 int pdl) {
    int group = n_heads / n_kv_heads;
    // The int8 cache's key channel scale that this thread's warp quantizes with (attend: warp
    // w takes channel (w % groups) * 32 + lane), for either mode's kv head. It is written at
    // boot, so it is loaded before the wait for the kernel before, off the step's chain of
    // latencies.
    float fk_head = 1.0f, fk_group = 1.0f;
    if (I8 && key_scale) {
        int ch = ((threadIdx.x >> 5) % (head_dim / 32)) * 32 + (threadIdx.x & 31);
        fk_head = __ldg(key_scale + ((blockIdx.x % n_heads) / group) * head_dim + ch);
        fk_group = __ldg(key_scale + (blockIdx.x % n_kv_heads) * head_dim + ch);
    }
    pdl_start(pdl);
    int pos = state[1];
    AttentionPlan p = attention_plan(pos, n_heads, n_kv_heads, max_slices, slice_positions,
                                     max_group_slices, group_from);
    int items = p.units * p.slices;
    if ((int)blockIdx.x >= items) {
        prefetch_l2(pf, pf_lines, (blockIdx.x - items) * blockDim.x + threadIdx.x,
                    (gridDim.x - items) * blockDim.x);
        return;
    }
    int unit = blockIdx.x % p.units;
    attend<I8>(p.grouped ? unit * group : unit, p.hb, blockIdx.x / p.units, p.slices, qkv, n_heads,
               n_kv_heads, head_dim, base, half_split, pos, kcache, vcache, kscales, vscales,
               key_scale != nullptr, p.grouped ? fk_group : fk_head, xf, xq, apart, acount + unit);
}

// The float cache (`kscales`, `vscales`, `key_scale` unused) and the int8 cache (`kcache`,
// `vcache` hold int8; see `attend`). engine.rs finds them by these names.
#define ATTENTION_ARGS                                                                          \
    const float *qkv, int n_heads, int n_kv_heads, int head_dim, float base, int half_split,  \
        const int *state, float *kcache, float *vcache, float *kscales, float *vscales,       \
        const float *key_scale, float *xf, i8 *xq, const u8 *pf, int pf_lines, float *apart,  \
        unsigned *acount, int max_slices, int slice_positions, int max_group_slices,          \
        int group_from, int pdl
#define ATTENTION_PASS                                                                          \
    qkv, n_heads, n_kv_heads, head_dim, base, half_split, state, kcache, vcache, kscales,     \
        vscales, key_scale, xf, xq, pf, pf_lines, apart, acount, max_slices, slice_positions,   \
        max_group_slices, group_from, pdl
extern "C" __global__ void __launch_bounds__(1024) attention(ATTENTION_ARGS) {
    attention_launch<false>(ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(1024) attention_i8(ATTENTION_ARGS) {
    attention_launch<true>(ATTENTION_PASS);
}

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
