// Decode kernels for one token of a llama-family model (llama, qwen2), in the order
// Engine::forward runs them on the CPU. Compiled by scripts/build-ptx.py with NVRTC 12.6 for
// compute_72 and compute_87; the PTX is committed and embedded by build.rs.
//
// Conventions (firmware/backend/cuda/mod.rs builds the arguments):
// - `state` is two ints in device memory: state[0] = the token to embed, state[1] = its
//   position. The argmax kernel writes the next token and advances the position, so a CUDA
//   graph of one step can be replayed without the host touching anything in between.
// - Matrices are stored struct-of-arrays per matrix (repacked at load from GGUF blocks, same
//   values): `q` = quants [rows][cols] for Q8_0, [rows][cols/2] nibbles for Q4_0/Q4_1/Q5_0 in the
//   GGUF order (byte j of a block: value j low, value j+16 high), `d` = f16 scale per block of 32,
//   `m` = f16 min per block (Q4_1), `qh` = 32 high bits per block (Q5_0); F16/F32 are plain rows.
// - Activations for the integer kernels are quantized like the CPU's (`quantize_q8` in
//   firmware/backend/cpu/matvec.rs): per block of 32, d = amax / 127, q = round(x / d) (half away
//   from zero), plus the block's integer sum, so results match the CPU backend to rounding order.
//   Each product kernel does this for its own input in shared memory (see `build_input`).


typedef unsigned char u8;
typedef signed char i8;
typedef unsigned int u32;
#define NEG_INF __int_as_float(0xff800000)

typedef unsigned short f16;  // IEEE half bits; converted with one PTX instruction (no headers)

__device__ __forceinline__ float h2f(f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8 };

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ __forceinline__ int warp_isum(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Sum over a block of up to 1024 threads; every thread gets the result.
__device__ float block_sum(float v, float* shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? shared32[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v, float* shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? shared32[lane] : NEG_INF;
    return warp_max(v);
}

// Quantizes the value each lane of a full warp holds as one block of 32 (lane = position).
__device__ __forceinline__ void quant_lane(float v, int blk, i8* qs, float* qd, int* qsum) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = (int)roundf(v * id);
    qs[blk * 32 + (threadIdx.x & 31)] = (i8)q;
    int s = warp_isum(q);
    if ((threadIdx.x & 31) == 0) {
        qd[blk] = d;
        qsum[blk] = s;
    }
}

// One value of row `r`, column `c` of a matrix in the layout above.
__device__ float mat_value(int type, const u8* q, const f16* d, const f16* m, const u32* qh,
                           int cols, int r, int c) {
    int nb = cols / 32, b = r * nb + c / 32, j = c % 32;
    switch (type) {
    case T_F32: return ((const float*)q)[(size_t)r * cols + c];
    case T_F16: return h2f(((const f16*)q)[(size_t)r * cols + c]);
    case T_Q8_0: return h2f(d[b]) * (float)((const i8*)q)[(size_t)r * cols + c];
    default: {
        u8 byte = q[(size_t)b * 16 + (j & 15)];
        int v = j < 16 ? (byte & 15) : (byte >> 4);
        if (type == T_Q4_0) return h2f(d[b]) * (float)(v - 8);
        if (type == T_Q4_1) return h2f(d[b]) * (float)v + h2f(m[b]);
        v |= ((qh[b] >> j) & 1) << 4;
        return h2f(d[b]) * (float)(v - 16);
    }
    }
}

// x = token_embd[state[0]]
extern "C" __global__ void embed(int type, const u8* q, const f16* d, const f16* m,
                                 const u32* qh, int dim, const int* state, float* x) {
    int tok = state[0];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += gridDim.x * blockDim.x)
        x[c] = mat_value(type, q, d, m, qh, dim, tok, c);
}

// --- matrix-vector products: one warp per row, 8 rows per block of 256 threads,
// `out[r] = (acc ? out[r] : 0) + W[r] . in + bias[r]`.
//
// Each block first builds its input in shared memory (the prologue), so no separate kernel
// (and no graph node) is needed for what feeds a product:
//   mode 0: in = x[0..n)
//   mode 1: in = x / rms(x) * nw          (RMSNorm, eps)
//   mode 2: in = silu(x[i]) * x[n + i]    (SwiGLU of [gate | up])
// and, for the integer kernels, its int8 blocks of 32 (d = amax / 127, q = round(v / d), and the
// block's integer sum), exactly as the CPU backend quantizes. Dynamic shared memory holds
// float in[n] then, for the integer kernels, i8 q[n], float d[n/32], int sum[n/32].

#define MV_THREADS 256
#define MV_ROWS (MV_THREADS / 32)

__device__ void build_input(const float* x, const float* nw, float eps, int mode, int n,
                            float* in) {
    __shared__ float shared32[32];
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v;
        if (mode == 2) {
            float g = x[i];
            v = g / (1.0f + expf(-g)) * x[n + i];
        } else {
            v = x[i];
        }
        in[i] = v;
    }
    if (mode == 1) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += in[i] * in[i];
        ss = block_sum(ss, shared32);  // syncs: every in[i] is written before it is read back
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) in[i] = in[i] * inv * nw[i];
    }
    __syncthreads();
}

// int8 blocks of in[0..n) (n % 32 == 0): one warp per block of 32.
__device__ void quantize_input(const float* in, int n, i8* qs, float* qd, int* qsum) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int b = warp; b < n / 32; b += nw) quant_lane(in[b * 32 + lane], b, qs, qd, qsum);
    __syncthreads();
}

__device__ __forceinline__ void finish_row(float sum, int r, float* out, const float* bias, int acc) {
    sum = warp_sum(sum);
    if ((threadIdx.x & 31) == 0) {
        if (bias) sum += bias[r];
        out[r] = acc ? out[r] + sum : sum;
    }
}

#define INPUT_ARGS const float *x, const float *nw, float eps, int mode
#define OUTPUT_ARGS float *out, const float *bias, int acc

// Prologue of the float kernels: in[] = the block's input. The block then walks rows
// grid-stride (ROWS_LOOP), so the prologue is paid once per block, not once per 8 rows.
#define FLOAT_PROLOGUE                                          \
    extern __shared__ float in[];                               \
    build_input(x, nw, eps, mode, cols, in);                    \
    int lane = threadIdx.x & 31;

#define ROWS_LOOP \
    for (int r = blockIdx.x * MV_ROWS + (threadIdx.x >> 5); r < rows; r += gridDim.x * MV_ROWS)

// Prologue of the integer kernels: in[], then its int8 blocks xq / xd / xs.
#define INT_PROLOGUE                                            \
    extern __shared__ float in[];                               \
    build_input(x, nw, eps, mode, cols, in);                    \
    i8* xq8 = (i8*)(in + cols);                                 \
    float* xd = (float*)(xq8 + cols);                           \
    int* xs = (int*)(xd + cols / 32);                           \
    quantize_input(in, cols, xq8, xd, xs);                      \
    const int* xq4 = (const int*)xq8;                           \
    int lane = threadIdx.x & 31;                                \
    int nb = cols >> 5;

extern "C" __global__ void matvec_f32(const float* w, int rows, int cols, INPUT_ARGS,
                                      OUTPUT_ARGS) {
    FLOAT_PROLOGUE
    ROWS_LOOP {
        const float* row = w + (size_t)r * cols;
        float sum = 0.0f;
        for (int c = lane; c < cols; c += 32) sum += row[c] * in[c];
        finish_row(sum, r, out, bias, acc);
    }
}

extern "C" __global__ void matvec_f16(const f16* w, int rows, int cols, INPUT_ARGS,
                                      OUTPUT_ARGS) {
    FLOAT_PROLOGUE
    ROWS_LOOP {
        const f16* row = w + (size_t)r * cols;
        float sum = 0.0f;
        if ((cols & 7) == 0) {
            // 8 halves (16 bytes) per lane per step.
            const uint4* row8 = (const uint4*)row;
#pragma unroll 4
            for (int c8 = lane; c8 < cols / 8; c8 += 32) {
                uint4 p = row8[c8];
                const float* a = in + c8 * 8;
                sum += h2f(p.x & 0xffff) * a[0] + h2f(p.x >> 16) * a[1];
                sum += h2f(p.y & 0xffff) * a[2] + h2f(p.y >> 16) * a[3];
                sum += h2f(p.z & 0xffff) * a[4] + h2f(p.z >> 16) * a[5];
                sum += h2f(p.w & 0xffff) * a[6] + h2f(p.w >> 16) * a[7];
            }
        } else {
            for (int c = lane; c < cols; c += 32) sum += h2f(row[c]) * in[c];
        }
        finish_row(sum, r, out, bias, acc);
    }
}

// Q8_0 x int8: 8 lanes per block of 32 (one dp4a word each), 4 blocks per warp step.
extern "C" __global__ void matvec_q8_0(const i8* q, const f16* d, int rows, int cols,
                                       INPUT_ARGS, OUTPUT_ARGS) {
    INT_PROLOGUE
    (void)xs;
    ROWS_LOOP {
        const int* rowq = (const int*)(q + (size_t)r * cols);
        const f16* rowd = d + (size_t)r * nb;
        float sum = 0.0f;
#pragma unroll 4
        for (int b = lane >> 3; b < nb; b += 4) {
            int w = lane & 7;
            int i = __dp4a(rowq[b * 8 + w], xq4[b * 8 + w], 0);
            sum += h2f(rowd[b]) * xd[b] * (float)i;
        }
        finish_row(sum, r, out, bias, acc);
    }
}

// 4-bit kernels: 4 lanes per block (one 32-bit word of 8 nibbles each), 8 blocks per step.
// Word w holds values 4w..4w+3 (low nibbles) and 16+4w..16+4w+3 (high nibbles).
extern "C" __global__ void matvec_q4_0(const u32* q, const f16* d, int rows, int cols,
                                       INPUT_ARGS, OUTPUT_ARGS) {
    INT_PROLOGUE
    ROWS_LOOP {
        const u32* rowq = q + (size_t)r * nb * 4;
        const f16* rowd = d + (size_t)r * nb;
        float sum = 0.0f;
#pragma unroll 4
        for (int b = lane >> 2; b < nb; b += 8) {
            int w = lane & 3;
            u32 word = rowq[b * 4 + w];
            int i = __dp4a((int)(word & 0x0F0F0F0F), xq4[b * 8 + w], 0);
            i = __dp4a((int)((word >> 4) & 0x0F0F0F0F), xq4[b * 8 + 4 + w], i);
            if (w == 0) i -= 8 * xs[b];
            sum += h2f(rowd[b]) * xd[b] * (float)i;
        }
        finish_row(sum, r, out, bias, acc);
    }
}

extern "C" __global__ void matvec_q4_1(const u32* q, const f16* d, const f16* m, int rows,
                                       int cols, INPUT_ARGS, OUTPUT_ARGS) {
    INT_PROLOGUE
    ROWS_LOOP {
        const u32* rowq = q + (size_t)r * nb * 4;
        const f16* rowd = d + (size_t)r * nb;
        const f16* rowm = m + (size_t)r * nb;
        float sum = 0.0f;
#pragma unroll 4
        for (int b = lane >> 2; b < nb; b += 8) {
            int w = lane & 3;
            u32 word = rowq[b * 4 + w];
            int i = __dp4a((int)(word & 0x0F0F0F0F), xq4[b * 8 + w], 0);
            i = __dp4a((int)((word >> 4) & 0x0F0F0F0F), xq4[b * 8 + 4 + w], i);
            sum += h2f(rowd[b]) * xd[b] * (float)i;
            if (w == 0) sum += h2f(rowm[b]) * (xd[b] * (float)xs[b]);
        }
        finish_row(sum, r, out, bias, acc);
    }
}

// Spreads 4 bits (b0..b3) to bit 4 of each byte.
__device__ __forceinline__ int high_bits(u32 four) {
    return (int)(((four & 1) << 4) | ((four & 2) << 11) | ((four & 4) << 18) | ((four & 8) << 25));
}

extern "C" __global__ void matvec_q5_0(const u32* q, const f16* d, const u32* qh, int rows,
                                       int cols, INPUT_ARGS, OUTPUT_ARGS) {
    INT_PROLOGUE
    ROWS_LOOP {
        const u32* rowq = q + (size_t)r * nb * 4;
        const u32* rowh = qh + (size_t)r * nb;
        const f16* rowd = d + (size_t)r * nb;
        float sum = 0.0f;
#pragma unroll 4
        for (int b = lane >> 2; b < nb; b += 8) {
            int w = lane & 3;
            u32 word = rowq[b * 4 + w], h = rowh[b];
            int lo = (int)(word & 0x0F0F0F0F) | high_bits(h >> (4 * w));
            int hi = (int)((word >> 4) & 0x0F0F0F0F) | high_bits(h >> (16 + 4 * w));
            int i = __dp4a(lo, xq4[b * 8 + w], 0);
            i = __dp4a(hi, xq4[b * 8 + 4 + w], i);
            if (w == 0) i -= 16 * xs[b];
            sum += h2f(rowd[b]) * xd[b] * (float)i;
        }
        finish_row(sum, r, out, bias, acc);
    }
}

// Rotary embedding of q and k (in qkv = [q | k | v]) at position state[1], then k and v are
// written to the cache row of that position. One thread per rotated pair of q or k.
extern "C" __global__ void rope_store(float* qkv, int n_heads, int n_kv_heads, int head_dim,
                                      float base, int half_split, const int* state, float* kcache,
                                      float* vcache) {
    int pos = state[1];
    int half = head_dim / 2, q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = (n_heads + n_kv_heads) * half;
    if (t < pairs) {
        int head = t / half, i = t % half;
        float* x = qkv + head * head_dim;  // k heads follow q heads
        float freq = powf(base, -((float)(2 * i)) / (float)head_dim);
        float s, c;
        sincosf((float)pos * freq, &s, &c);
        int a = half_split ? i : 2 * i, b = half_split ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
    // Each k pair is stored by the thread that rotated it (no order between blocks is needed);
    // v is copied by the first kv_dim threads.
    if (t < pairs && t >= n_heads * half) {
        int kt = t - n_heads * half, head = kt / half, i = kt % half;
        int a = half_split ? i : 2 * i, b = half_split ? i + half : 2 * i + 1;
        const float* k = qkv + q_dim + head * head_dim;
        kcache[(size_t)pos * kv_dim + head * head_dim + a] = k[a];
        kcache[(size_t)pos * kv_dim + head * head_dim + b] = k[b];
    }
    if (t < kv_dim) vcache[(size_t)pos * kv_dim + t] = qkv[q_dim + kv_dim + t];
}

// One block per query head: scores over positions 0..=pos of its kv head, softmax, weighted sum
// of values. `att` is scratch of n_heads * ctx floats. Every phase keeps many independent loads
// in flight (one position per thread for the scores, (partition, dim) pairs for the values):
// a chain of dependent loads per warp would make decode latency-bound here.
extern "C" __global__ void attention(const float* q, const float* kcache, const float* vcache,
                                     int kv_dim, int head_dim, int group, int ctx,
                                     const int* state, float* att, float* out) {
    __shared__ float shared32[32];
    __shared__ float qh[256];
    __shared__ float partial[1024];
    int h = blockIdx.x, pos = state[1], kvh = h / group;
    float* a = att + (size_t)h * ctx;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) qh[i] = q[h * head_dim + i];
    __syncthreads();
    float scale = 1.0f / sqrtf((float)head_dim);
    float mx = NEG_INF;
    for (int t = threadIdx.x; t <= pos; t += blockDim.x) {
        const float4* k4 = (const float4*)(kcache + (size_t)t * kv_dim + kvh * head_dim);
        float s = 0.0f;
        for (int i = 0; i < head_dim / 4; i++) {
            float4 k = k4[i];
            s += qh[4 * i] * k.x + qh[4 * i + 1] * k.y + qh[4 * i + 2] * k.z + qh[4 * i + 3] * k.w;
        }
        s *= scale;
        a[t] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, shared32);
    float sum = 0.0f;
    for (int t = threadIdx.x; t <= pos; t += blockDim.x) {
        float e = expf(a[t] - mx);
        a[t] = e;
        sum += e;
    }
    sum = block_sum(sum, shared32);
    __syncthreads();
    // Values: thread (p, i) sums positions t = p, p + P, ... for output element i.
    int P = blockDim.x / head_dim;
    int i = threadIdx.x % head_dim, p = threadIdx.x / head_dim;
    float acc = 0.0f;
    if (p < P)
        for (int t = p; t <= pos; t += P) acc += a[t] * vcache[(size_t)t * kv_dim + kvh * head_dim + i];
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float o = 0.0f;
        for (int pp = 0; pp < P; pp++) o += partial[pp * head_dim + threadIdx.x];
        out[h * head_dim + threadIdx.x] = o / sum;
    }
}

// Greedy pick: state[0] = argmax(logits) (lowest index on ties, as the CPU sampler),
// state[1] += 1, and the token is also written to host_tokens[position] (mapped host memory),
// so steps can run back to back and the host reads every token afterwards.
extern "C" __global__ void argmax_advance(const float* logits, int n, int* state,
                                          volatile int* host_tokens) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = logits[i];
        if (v > bv) { bv = v; bi = i; }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = best_v[threadIdx.x + s];
            int oi = best_i[threadIdx.x + s];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (host_tokens) host_tokens[state[1]] = best_i[0];
        state[0] = best_i[0];
        state[1] += 1;
    }
}
