// Batched prefill: a prompt's tokens go through each layer together, `n` tokens at a time
// (firmware/engine/cuda_prefill.rs launches these, in the order of `Engine::forward`). Where
// decode reads each weight once per token, a batch reads it once per `n` tokens, and the
// products run on tensor cores.
//
// Layouts (token-major: row t of each buffer is token t's):
// - `x`:   the residual, f32, `dim` per token.
// - `xh`:  a product's input, f16, `ldx` per token: the normed residual, the attention output
//          or SwiGLU of gate/up (each written just before the product that reads it).
// - `qkv`: q|k|v of each token, f32, `ldq` per token (rotated in place by `rope_store`).
// - `gu`:  gate|up (or gate/up stacked tile by tile), f32, `ldg` per token.
// The KV cache and the weights are decode.cu's (common.cuh decodes them).
//
// Precision: products take f16 inputs and f16 weights (integer types dequantized to f16 on the
// way into shared memory) and sum in f32, as cuBLAS does for llama.cpp's batches; decode keeps
// float or int8 inputs, so a batched prompt's logits differ from token-by-token ones within
// the parity gate (tools/tests/cuda.rs). The residual, norms, RoPE and attention stay f32.
//
// Every kernel waits for the one before (`pdl_wait`) before it touches activations: with
// dependent launch on, the host may start a kernel early.

#include "common.cuh"

// x[t] = token_embd[tokens[t]] for the n tokens. One block a token.
extern "C" __global__ void embed_rows(int type, const u8* q, const f16* d, const f16* m,
                                      const u32* qh, int dim, const u32* tokens, float* x) {
    pdl_wait();
    int t = blockIdx.x;
    int tok = (int)tokens[t];
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        x[(size_t)t * dim + c] = mat_value(type, q, d, m, qh, dim, tok, c);
}

// xh[t] = RMSNorm(x[t], nw) in f16 (the formula of decode.cu's prep_input). One block a token.
extern "C" __global__ void norm_rows(const float* x, const float* nw, int dim, float eps,
                                     f16* xh, int ldx) {
    __shared__ float shared32[32];
    pdl_wait();
    const float* row = x + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += row[c] * row[c];
    ss = block_sum(ss, shared32);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    f16* out = xh + (size_t)blockIdx.x * ldx;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) out[c] = f2h(row[c] * inv * nw[c]);
}

// xh[t][i] = silu(gate_i) * up_i in f16, from gate|up (`tiled` = 0) or the tile-by-tile stack
// (32 rows of gate, then the same 32 of up: weights.rs `gate_up_tiled`). One block a token.
extern "C" __global__ void swiglu_rows(const float* gu, int ldg, int hidden, int tiled, f16* xh,
                                       int ldx) {
    pdl_wait();
    const float* row = gu + (size_t)blockIdx.x * ldg;
    f16* out = xh + (size_t)blockIdx.x * ldx;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        int g = tiled ? (i / 32) * 64 + (i % 32) : i;
        int u = tiled ? g + 32 : hidden + i;
        out[i] = f2h(silu_mul(row[g], row[u]));
    }
}

// --- products: y[t][r] = (acc ? y[t][r] : 0) + W[r] . xh[t] + bias[r], for r < rows, t < n.
//
// A block of 128 threads (4 warps) computes a tile of GM rows x GN tokens, GK columns at a
// time: each thread loads 2 x 16 weights of one row (dequantized to f16) and 2 x 16 inputs of
// one token, and each warp multiplies its 32 x 32 quarter with mma.sync m16n8k16 (f16 in, f32
// sums): 2 x 4 tiles of 16 x 8, their fragments read with ldmatrix. Two shared buffers: the
// next step's loads are issued before the current one is multiplied. The products are bound
// by the latency of those loads, not by the tensor cores (grids are small: a 1,536-row
// product of 512 tokens is 192 blocks, about one a multiprocessor, waiting ~1 us a step), so
// a step is wide (64 columns) to move more bytes per wait. Rows of shared memory are padded to
// GS halves (144 bytes), so the 8 rows an ldmatrix phase reads fall in different banks. sm_72 (Xavier) has neither mma
// m16n8k16 nor ldmatrix: it computes the same sums with plain FMAs (correct, slow).

#define GM 64
#define GN 64
#define GK 64
#define GS 72

// Two halves in one word, `lo` first (as they lie in memory).
__device__ __forceinline__ u32 pack2(f16 lo, f16 hi) { return (u32)lo | ((u32)hi << 16); }

// 16 weights of row r from column c (a multiple of 16) as f16 pairs (two 16-byte words);
// zeros past the matrix. Built in registers (no array: an array cast to words goes through
// local memory).
__device__ __forceinline__ void weights16(int type, const u8* q, const f16* d, const f16* m,
                                          const u32* qh, int rows, int cols, int r, int c,
                                          uint4* out) {
    u32 p[8];
    if (r >= rows) {
        out[0] = out[1] = make_uint4(0, 0, 0, 0);
        return;
    }
    size_t nb = cols / 32, b = (size_t)r * nb + c / 32;
    bool whole = c + 16 <= cols;
    if (type == T_F16 && whole && (cols & 7) == 0) {
        const uint4* src = (const uint4*)((const f16*)q + (size_t)r * cols + c);
        out[0] = __ldg(src);
        out[1] = __ldg(src + 1);
        return;
    } else if (type == T_Q8_0) {
        float s = h2f(d[b]);
        uint4 v = __ldg((const uint4*)((const i8*)q + (size_t)r * cols + c));
        u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 wd = words[i / 2];
            int sh = 16 * (i & 1);
            float a = (float)(i8)((wd >> sh) & 0xff), bb = (float)(i8)((wd >> (sh + 8)) & 0xff);
            p[i] = pack2(f2h(s * a), f2h(s * bb));
        }
    } else if (type == T_Q4_0 || type == T_Q4_1) {
        float s = h2f(d[b]);
        float lo = type == T_Q4_0 ? -8.0f * s : h2f(m[b]);
        uint4 v = __ldg((const uint4*)(q + b * 16));
        u32 words[4] = {v.x, v.y, v.z, v.w};
        int shift = (c & 16) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 wd = words[i / 2] >> shift;
            int sh = 16 * (i & 1);
            float a = (float)((wd >> sh) & 15), bb = (float)((wd >> (sh + 8)) & 15);
            p[i] = pack2(f2h(s * a + lo), f2h(s * bb + lo));
        }
    } else {
#pragma unroll 2
        for (int i = 0; i < 8; i++) {
            int k = c + 2 * i;
            f16 a = k < cols ? f2h(mat_value(type, q, d, m, qh, cols, r, k)) : (f16)0;
            f16 bb = k + 1 < cols ? f2h(mat_value(type, q, d, m, qh, cols, r, k + 1)) : (f16)0;
            p[i] = pack2(a, bb);
        }
    }
    out[0] = make_uint4(p[0], p[1], p[2], p[3]);
    out[1] = make_uint4(p[4], p[5], p[6], p[7]);
}

// 16 weights of row r and 16 inputs of token t from column c (zeros past the matrix or the
// chunk), as two 16-byte words each.
__device__ __forceinline__ void load16(int type, const u8* q, const f16* d, const f16* m,
                                       const u32* qh, int rows, int cols, const f16* xh, int ldx,
                                       int n, int r, int t, int c, uint4* w, uint4* x) {
    weights16(type, q, d, m, qh, rows, cols, r, c, w);
    if (t < n && c + 16 <= cols && (ldx & 7) == 0) {
        const uint4* src = (const uint4*)(xh + (size_t)t * ldx + c);
        x[0] = src[0];
        x[1] = src[1];
    } else {
        u32 p[8];
        const f16* row = xh + (size_t)t * ldx;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int k = c + 2 * i;
            p[i] = pack2(t < n && k < cols ? row[k] : (f16)0, t < n && k + 1 < cols ? row[k + 1] : (f16)0);
        }
        x[0] = make_uint4(p[0], p[1], p[2], p[3]);
        x[1] = make_uint4(p[4], p[5], p[6], p[7]);
    }
}

// This thread's share of one step's loads: row r0 + lr's weights and token t0 + lr's inputs at
// columns k0 + lh and k0 + lh + 32, 16 each.
__device__ __forceinline__ void load_step(int type, const u8* q, const f16* d, const f16* m,
                                          const u32* qh, int rows, int cols, const f16* xh,
                                          int ldx, int n, int r, int t, int c, uint4* w,
                                          uint4* x) {
    load16(type, q, d, m, qh, rows, cols, xh, ldx, n, r, t, c, w, x);
    load16(type, q, d, m, qh, rows, cols, xh, ldx, n, r, t, c + 32, w + 2, x + 2);
}

__device__ __forceinline__ u32 shared_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// c += a b on one m16n8k16 tile (f16 in, f32 sums); sm_80 and newer.
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void ldmatrix4(u32* r, const f16* p, bool trans) {
#if __CUDA_ARCH__ >= 800
    u32 a = shared_addr(p);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

// c[i][j] += the warp's 32 x 32 quarter (rows wm.., tokens wn..) of one GK step.
__device__ __forceinline__ void step_mma(float (*c)[4][4], const f16* ws, const f16* xs, int wm,
                                         int wn) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < GK; kk += 16) {
#if __CUDA_ARCH__ >= 800
        // b[jj]: tokens wn + 16 jj.. as two n-tiles' fragments (b0, b1 of each).
        u32 a[2][4], b[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
            ldmatrix4(a[i], ws + (wm + 16 * i + (lane & 15)) * GS + kk + (lane >> 4) * 8, false);
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
            ldmatrix4(b[jj],
                      xs + (wn + 16 * jj + (lane >> 4) * 8 + (lane & 7)) * GS + kk +
                          ((lane >> 3) & 1) * 8,
                      false);
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                mma16816(c[i][j], a[i], b[j / 2][2 * (j & 1)], b[j / 2][2 * (j & 1) + 1]);
#else
        // The same fragments' sums: c0, c1 row g, tokens 2tg, 2tg+1; c2, c3 row g + 8.
        int g = lane >> 2, tg = lane & 3;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const f16* ar = ws + (wm + 16 * i + g + 8 * (e >> 1)) * GS + kk;
                    const f16* br = xs + (wn + 8 * j + 2 * tg + (e & 1)) * GS + kk;
                    float s = 0.0f;
                    for (int k = 0; k < 16; k++) s += h2f(ar[k]) * h2f(br[k]);
                    c[i][j][e] += s;
                }
#endif
    }
}

extern "C" __global__ void __launch_bounds__(128)
    gemm(int type, const u8* q, const f16* d, const f16* m, const u32* qh, int rows, int cols,
         const f16* xh, int ldx, int n, float* y, int ldy, const float* bias, int acc) {
    __shared__ __align__(16) f16 ws[2][GM * GS];
    __shared__ __align__(16) f16 xs[2][GN * GS];
    pdl_wait();
    int row_tiles = (rows + GM - 1) / GM;
    int r0 = (blockIdx.x % row_tiles) * GM, t0 = (blockIdx.x / row_tiles) * GN;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    // This thread's share of each load: 16 values of row (or token) `lr` from column `lh`.
    int lr = threadIdx.x >> 1, lh = (threadIdx.x & 1) * 16;
    float c[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) c[i][j][e] = 0.0f;
    uint4 w[4], x[4];
    load_step(type, q, d, m, qh, rows, cols, xh, ldx, n, r0 + lr, t0 + lr, lh, w, x);
    int cur = 0;
    for (int k0 = 0; k0 < cols; k0 += GK) {
        uint4* wd = (uint4*)(ws[cur] + lr * GS + lh);
        uint4* xd = (uint4*)(xs[cur] + lr * GS + lh);
        wd[0] = w[0];
        wd[1] = w[1];
        wd[4] = w[2];  // 32 columns on: 64 bytes, 4 words
        wd[5] = w[3];
        xd[0] = x[0];
        xd[1] = x[1];
        xd[4] = x[2];
        xd[5] = x[3];
        __syncthreads();
        // The next step's loads go out before this step's products.
        if (k0 + GK < cols)
            load_step(type, q, d, m, qh, rows, cols, xh, ldx, n, r0 + lr, t0 + lr, k0 + GK + lh,
                      w, x);
        step_mma(c, ws[cur], xs[cur], wm, wn);
        // The other buffer is written next; the one read here is not written again until
        // every warp has passed the next barrier.
        cur ^= 1;
    }
    int g = lane >> 2, tg = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + wm + 16 * i + g + 8 * (e >> 1);
                int t = t0 + wn + 8 * j + 2 * tg + (e & 1);
                if (r < rows && t < n) {
                    float* out = y + (size_t)t * ldy + r;
                    *out = (acc ? *out : 0.0f) + c[i][j][e] + (bias ? bias[r] : 0.0f);
                }
            }
}

// --- products through cuBLAS (engine/cuda_prefill.rs `Products::Blas`): integer and K-quant
// weights are dequantized to f16, `nrows` rows from row r0 at a time, into a scratch matrix
// cuBLAS reads (`cols` a multiple of 16); the bias, which the f16 product cannot add, is added
// after it.

// One word of two f16: the signed bytes at bit `sh` and `sh + 8` of `w` times `s` (Q8_0).
__device__ __forceinline__ u32 q8_pair(u32 w, int sh, float s) {
    return pack2(f2h(s * (float)(i8)((w >> sh) & 0xff)), f2h(s * (float)(i8)((w >> (sh + 8)) & 0xff)));
}

// The nibbles at bit `sh` and `sh + 8` of `w` times `s`, plus `lo` (Q4_0: -8 s; Q4_1: m).
__device__ __forceinline__ u32 q4_pair(u32 w, int sh, float s, float lo) {
    return pack2(f2h(s * (float)((w >> sh) & 15) + lo), f2h(s * (float)((w >> (sh + 8)) & 15) + lo));
}

// `weights16` for the types most files hold (Q8_0, Q4_0, Q4_1), written straight to `dst`
// without the generic path's array (which lives in local memory); false for other types.
__device__ __forceinline__ bool blocks16(int type, const u8* q, const f16* d, const f16* m,
                                         int cols, int r, int c, uint4* dst) {
    size_t b = (size_t)r * (cols / 32) + c / 32;
    if (type == T_Q8_0) {
        float s = h2f(d[b]);
        uint4 v = __ldg((const uint4*)((const i8*)q + (size_t)r * cols + c));
        dst[0] = make_uint4(q8_pair(v.x, 0, s), q8_pair(v.x, 16, s), q8_pair(v.y, 0, s),
                            q8_pair(v.y, 16, s));
        dst[1] = make_uint4(q8_pair(v.z, 0, s), q8_pair(v.z, 16, s), q8_pair(v.w, 0, s),
                            q8_pair(v.w, 16, s));
        return true;
    }
    if (type == T_Q4_0 || type == T_Q4_1) {
        float s = h2f(d[b]);
        float lo = type == T_Q4_0 ? -8.0f * s : h2f(m[b]);
        uint4 v = __ldg((const uint4*)(q + b * 16));
        int sh = (c & 16) ? 4 : 0;  // the block's second 16 are its high nibbles
        v.x >>= sh, v.y >>= sh, v.z >>= sh, v.w >>= sh;
        dst[0] = make_uint4(q4_pair(v.x, 0, s, lo), q4_pair(v.x, 16, s, lo),
                            q4_pair(v.y, 0, s, lo), q4_pair(v.y, 16, s, lo));
        dst[1] = make_uint4(q4_pair(v.z, 0, s, lo), q4_pair(v.z, 16, s, lo),
                            q4_pair(v.w, 0, s, lo), q4_pair(v.w, 16, s, lo));
        return true;
    }
    return false;
}

// out[i] = W[r0 + i] in f16 for i < nrows. A thread 16 columns of one row, grid-strided
// (nrows x cols fits the scratch: 32-bit indices).
extern "C" __global__ void dequant_rows(int type, const u8* q, const f16* d, const f16* m,
                                        const u32* qh, int rows, int cols, int r0, int nrows,
                                        f16* out) {
    pdl_wait();
    int per_row = cols / 16, items = nrows * per_row;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < items; i += gridDim.x * blockDim.x) {
        int r = i / per_row, c = (i - r * per_row) * 16;
        uint4* dst = (uint4*)(out + (size_t)r * cols + c);
        if (!blocks16(type, q, d, m, cols, r0 + r, c, dst))
            weights16(type, q, d, m, qh, rows, cols, r0 + r, c, dst);
    }
}

// y[t][r] += bias[r] for r < rows. One block a token.
extern "C" __global__ void bias_rows(float* y, int ldy, int rows, const float* bias) {
    pdl_wait();
    float* row = y + (size_t)blockIdx.x * ldy;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) row[r] += bias[r];
}

// --- RoPE and the KV cache: each token's q and k rotated in place at position p0 + t (as
// decode.cu's `attend`), and k, v stored at that position (`kv`, KV_*): f32 rows, half rows,
// or int8 blocks of 32 with their scales (`key_scale`: the keys' channel scales, k divided by
// them first), as `attend` stores them. One block a token, of a multiple of 32 threads.
extern "C" __global__ void rope_store(float* qkv, int ldq, int p0, int n_heads, int n_kv_heads,
                                      int head_dim, float base, int half_split, float* kcache,
                                      float* vcache, float* kscales, float* vscales,
                                      const float* key_scale, int kv) {
    pdl_wait();
    int t = blockIdx.x, pos = p0 + t, half = head_dim / 2;
    int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    float* row = qkv + (size_t)t * ldq;
    // Pairs of every q head, then of every k head.
    for (int p = threadIdx.x; p < (n_heads + n_kv_heads) * half; p += blockDim.x) {
        int head = p / half, i = p % half;
        float* src = head < n_heads ? row + head * head_dim : row + q_dim + (head - n_heads) * head_dim;
        float freq = powf(base, -((float)(2 * i)) / (float)head_dim);
        float s, c;
        sincosf((float)pos * freq, &s, &c);
        int a = half_split ? i : 2 * i, b = half_split ? i + half : 2 * i + 1;
        float x0 = src[a], x1 = src[b];
        src[a] = x0 * c - x1 * s;
        src[b] = x0 * s + x1 * c;
    }
    __syncthreads();
    const float* k = row + q_dim;
    const float* v = row + q_dim + kv_dim;
    if (kv == KV_F32) {
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            kcache[(size_t)pos * kv_dim + i] = k[i];
            vcache[(size_t)pos * kv_dim + i] = v[i];
        }
        return;
    }
    if (kv == KV_F16) {
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            ((f16*)kcache)[(size_t)pos * kv_dim + i] = f2h(k[i]);
            ((f16*)vcache)[(size_t)pos * kv_dim + i] = f2h(v[i]);
        }
        return;
    }
    // One warp a block of 32: k's (over its channel scales) and v's.
    int lane = threadIdx.x & 31, groups = kv_dim / 32;
    for (int w = threadIdx.x >> 5; w < 2 * groups; w += blockDim.x >> 5) {
        int g = w % groups, i = g * 32 + lane;
        bool is_k = w < groups;
        float x = is_k ? (key_scale ? k[i] / key_scale[i] : k[i]) : v[i];
        float dq;
        int qv = quant32(x, dq);
        ((i8*)(is_k ? kcache : vcache))[(size_t)pos * kv_dim + i] = (i8)qv;
        if (lane == 0) (is_k ? kscales : vscales)[(size_t)pos * groups + g] = dq;
    }
}

// --- causal attention over the batch: query t (position p0 + t) of head h attends over
// positions 0..=p0 + t of its KV head. A block takes QT queries of one head and walks the
// cache KT positions at a time through shared memory (the int8 cache dequantized on the way;
// its queries times the key channel scales, as `attend`'s), with an online softmax per query:
// lane j scores position j of the tile, then every lane adds the tile's values to the output
// dimensions it owns (lane + 32 i). The output goes to xh in f16: wo's input.
// Shared: QT x head_dim queries, KT x (head_dim + 1) keys (padded: lanes read different rows),
// KT x head_dim values, floats. Threads: 256, QT / 8 queries a warp.
extern "C" __global__ void __launch_bounds__(256)
    attention_rows(const float* qkv, int ldq, int n, int p0, int n_heads, int n_kv_heads,
                   int head_dim, const float* kcache, const float* vcache, const float* kscales,
                   const float* vscales, const float* key_scale, int kv, int qt, int kt,
                   f16* xh, int ldx) {
    extern __shared__ float smem[];
    pdl_wait();
    int q_tiles = (n + qt - 1) / qt;
    int h = blockIdx.x / q_tiles, tq0 = (blockIdx.x % q_tiles) * qt;
    int kvh = h / (n_heads / n_kv_heads), kv_dim = n_kv_heads * head_dim, groups = kv_dim / 32;
    float* qs = smem;
    float* ks = qs + qt * head_dim;
    float* vs = ks + kt * (head_dim + 1);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < qt * head_dim; i += blockDim.x) {
        int tq = tq0 + i / head_dim, dd = i % head_dim;
        float v = tq < n ? qkv[(size_t)tq * ldq + h * head_dim + dd] : 0.0f;
        if (kv == KV_I8 && key_scale) v *= key_scale[kvh * head_dim + dd];
        qs[i] = v;
    }
    int per_warp = qt / 8;
    float scale = 1.0f / sqrtf((float)head_dim);
    // Up to 2 queries a warp, each lane up to 8 output dimensions (head_dim <= 256).
    float mx[2], l[2], o[2][8];
#pragma unroll
    for (int a = 0; a < 2; a++) {
        mx[a] = NEG_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) o[a][i] = 0.0f;
    }
    int last = p0 + min(n, tq0 + qt) - 1;  // the block's last query position
    for (int k0 = 0; k0 <= last; k0 += kt) {
        __syncthreads();
        for (int i = threadIdx.x; i < kt * head_dim; i += blockDim.x) {
            int j = i / head_dim, dd = i % head_dim, t = k0 + j;
            float kk = 0.0f, vv = 0.0f;
            if (t <= last) {
                size_t at = (size_t)t * kv_dim + kvh * head_dim + dd;
                if (kv == KV_I8) {
                    size_t s = (size_t)t * groups + (kvh * head_dim + dd) / 32;
                    kk = (float)((const i8*)kcache)[at] * kscales[s];
                    vv = (float)((const i8*)vcache)[at] * vscales[s];
                } else if (kv == KV_F16) {
                    kk = h2f(((const f16*)kcache)[at]);
                    vv = h2f(((const f16*)vcache)[at]);
                } else {
                    kk = kcache[at];
                    vv = vcache[at];
                }
            }
            ks[j * (head_dim + 1) + dd] = kk;
            vs[j * head_dim + dd] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 2; a++) {
            if (a >= per_warp) break;
            int qi = warp * per_warp + a, tq = tq0 + qi;
            if (tq >= n) break;
            int qpos = p0 + tq, t = k0 + lane;
            float s = NEG_INF;
            if (lane < kt && t <= qpos) {
                const float* qr = qs + qi * head_dim;
                const float* kr = ks + lane * (head_dim + 1);
                float acc = 0.0f;
                for (int dd = 0; dd < head_dim; dd++) acc += qr[dd] * kr[dd];
                s = acc * scale;
            }
            float mn = fmaxf(mx[a], warp_max(s));  // finite: position 0 <= every query's
            float corr = expf(mx[a] - mn);
            float p = s == NEG_INF ? 0.0f : expf(s - mn);
            l[a] = l[a] * corr + warp_sum(p);
            mx[a] = mn;
#pragma unroll
            for (int i = 0; i < 8; i++) o[a][i] *= corr;
            int top = min(kt, qpos - k0 + 1);
            for (int j = 0; j < top; j++) {
                float pj = __shfl_sync(0xffffffff, p, j);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    int dd = lane + 32 * i;
                    if (dd < head_dim) o[a][i] += pj * vs[j * head_dim + dd];
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
        if (a >= per_warp) break;
        int tq = tq0 + warp * per_warp + a;
        if (tq >= n) break;
        f16* out = xh + (size_t)tq * ldx + h * head_dim;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int dd = lane + 32 * i;
            if (dd < head_dim) out[dd] = f2h(o[a][i] / l[a]);
        }
    }
}

// --- causal attention on tensor cores (sm_80 and newer, heads of 64 or 128: the host picks
// `attention_rows` otherwise), flash attention's tiling. A block of 4 warps takes AQ = 64
// queries of one head, 16 a warp, and walks the cache AK = 64 positions at a time: each tile's
// keys and values converted to f16 into shared memory (the int8 cache dequantized; queries
// times the key channel scales, as `attend`'s). A warp's scores S = Q K^T (16 x 64) and its
// output O += P V are mma.sync m16n8k16 (f16 in, f32 sums); the scores' accumulators become
// P's fragments in registers (the m16n8 accumulator of two n-tiles is the m16k16 A fragment).
// The softmax is online per query row, in f32 (base 2, the scale folded in). The output goes
// to xh in f16: wo's input. Blocks run the last (longest) query tiles first.
#define AQ 64
#define AK 64

// Four values of one key (or value) row from column dd, as f16 into shared memory at `dst`
// (int8 cache: times its group's scale; the half cache's as they are).
__device__ __forceinline__ void store4_f16(f16* dst, const float* cache, const float* scales,
                                           int kv, size_t at, size_t s) {
    if (kv == KV_F16) {
        *(uint2*)dst = *(const uint2*)((const f16*)cache + at);
        return;
    }
    float a, b, c, e;
    if (kv == KV_I8) {
        u32 w = *(const u32*)((const i8*)cache + at);
        float sc = scales[s];
        a = (float)(i8)(w & 0xff) * sc;
        b = (float)(i8)((w >> 8) & 0xff) * sc;
        c = (float)(i8)((w >> 16) & 0xff) * sc;
        e = (float)(i8)(w >> 24) * sc;
    } else {
        float4 v = *(const float4*)(cache + at);
        a = v.x, b = v.y, c = v.z, e = v.w;
    }
    *(uint2*)dst = make_uint2(pack2(f2h(a), f2h(b)), pack2(f2h(c), f2h(e)));
}

template <int HD>
__device__ __forceinline__ void attention_tc(const float* qkv, int ldq, int n, int p0,
                                             int n_heads, int n_kv_heads, const float* kcache,
                                             const float* vcache, const float* kscales,
                                             const float* vscales, const float* key_scale,
                                             int kv, f16* xh, int ldx) {
#if __CUDA_ARCH__ >= 800
    // Rows of HD + 8 halves: 16 bytes past a multiple of 128, so an ldmatrix phase's 8 rows
    // fall in different banks.
    constexpr int S = HD + 8;
    __shared__ __align__(16) f16 ks[AK * S];
    __shared__ __align__(16) f16 vs[AK * S];
    pdl_wait();
    int q_tiles = (n + AQ - 1) / AQ;
    int h = blockIdx.x % n_heads, tq0 = (q_tiles - 1 - blockIdx.x / n_heads) * AQ;
    int kvh = h / (n_heads / n_kv_heads), kv_dim = n_kv_heads * HD, groups = kv_dim / 32;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    // The block's queries (through ks), then each warp's 16 as A fragments in registers.
    for (int i = tid; i < AQ * HD; i += 128) {
        int r = i / HD, dd = i % HD, tq = tq0 + r;
        float v = tq < n ? qkv[(size_t)tq * ldq + h * HD + dd] : 0.0f;
        if (kv == KV_I8 && key_scale) v *= key_scale[kvh * HD + dd];
        ks[r * S + dd] = f2h(v);
    }
    __syncthreads();
    u32 qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        ldmatrix4(qa[kk], ks + (16 * warp + (lane & 15)) * S + 16 * kk + (lane >> 4) * 8, false);
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    // Rows g and g + 8 of the warp's 16: running max (base 2, scaled) and this thread's part
    // of the sum of their weights.
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.0f, 0.0f};
    const float scale = 1.4426950408889634f / sqrtf((float)HD);
    int q_first = p0 + tq0 + 16 * warp;   // the warp's first query position
    int last = p0 + min(n, tq0 + AQ) - 1;  // the block's last query position
    for (int k0 = 0; k0 <= last; k0 += AK) {
        __syncthreads();  // every warp is done with the last tile (or the queries)
        for (int i = tid; i < AK * HD / 4; i += 128) {
            int j = (4 * i) / HD, dd = (4 * i) % HD, t = k0 + j;
            f16* kd = ks + j * S + dd;
            f16* vd = vs + j * S + dd;
            if (t <= last) {
                size_t at = (size_t)t * kv_dim + kvh * HD + dd;
                size_t s = (size_t)t * groups + (kvh * HD + dd) / 32;
                store4_f16(kd, kcache, kscales, kv, at, s);
                store4_f16(vd, vcache, vscales, kv, at, s);
            } else {
                *(uint2*)kd = make_uint2(0, 0);
                *(uint2*)vd = make_uint2(0, 0);
            }
        }
        __syncthreads();
        if (k0 > q_first + 15) continue;  // the whole tile is after the warp's queries
        float s[AK / 8][4];
#pragma unroll
        for (int j = 0; j < AK / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int jj = 0; jj < AK / 16; jj++) {
                u32 b[4];
                ldmatrix4(b, ks + (16 * jj + (lane >> 4) * 8 + (lane & 7)) * S + 16 * kk +
                                 ((lane >> 3) & 1) * 8,
                          false);
                mma16816(s[2 * jj], qa[kk], b[0], b[1]);
                mma16816(s[2 * jj + 1], qa[kk], b[2], b[3]);
            }
        // Scale, mask what follows each query, and the rows' new maxima (over the quad).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < AK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int pos = k0 + 8 * j + 2 * tg + (e & 1), qpos = q_first + g + 8 * (e >> 1);
                s[j][e] = pos <= qpos ? s[j][e] * scale : NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
            // Finite: position 0 precedes every query, and tile 0 is never skipped.
            float mn = fmaxf(mrow[r], mx[r]);
            corr[r] = exp2f(mrow[r] - mn);
            mrow[r] = mn;
            lrow[r] *= corr[r];
        }
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[j][e] *= corr[e >> 1];
        u32 pa[AK / 16][4];
#pragma unroll
        for (int j = 0; j < AK / 8; j++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = exp2f(s[j][e] - mrow[e >> 1]);
                lrow[e >> 1] += p[e];
            }
            pa[j / 2][2 * (j & 1)] = pack2(f2h(p[0]), f2h(p[1]));
            pa[j / 2][2 * (j & 1) + 1] = pack2(f2h(p[2]), f2h(p[3]));
        }
#pragma unroll
        for (int kk = 0; kk < AK / 16; kk++)
#pragma unroll
            for (int dj = 0; dj < HD / 16; dj++) {
                u32 b[4];
                ldmatrix4(b, vs + (16 * kk + (lane & 15)) * S + 16 * dj + (lane >> 4) * 8, true);
                mma16816(o[2 * dj], pa[kk], b[0], b[1]);
                mma16816(o[2 * dj + 1], pa[kk], b[2], b[3]);
            }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += __shfl_xor_sync(0xffffffff, lrow[r], 1);
        lrow[r] += __shfl_xor_sync(0xffffffff, lrow[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int tq = tq0 + 16 * warp + g + 8 * r;
        if (tq >= n) continue;
        float inv = 1.0f / lrow[r];
        u32* out = (u32*)(xh + (size_t)tq * ldx + h * HD + 2 * tg);
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            out[4 * j] = pack2(f2h(o[j][2 * r] * inv), f2h(o[j][2 * r + 1] * inv));
    }
#endif
}

#define ATTENTION_TC(HD)                                                                      \
    extern "C" __global__ void __launch_bounds__(128) attention_tc##HD(                       \
        const float* qkv, int ldq, int n, int p0, int n_heads, int n_kv_heads,                \
        const float* kcache, const float* vcache, const float* kscales, const float* vscales, \
        const float* key_scale, int kv, f16* xh, int ldx) {                                   \
        attention_tc<HD>(qkv, ldq, n, p0, n_heads, n_kv_heads, kcache, vcache, kscales,       \
                         vscales, key_scale, kv, xh, ldx);                                    \
    }
ATTENTION_TC(64)
ATTENTION_TC(128)
