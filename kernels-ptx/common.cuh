// What every kernel file shares: types, f16 conversion, the weight layout's decoding
// (`mat_value`; the layout is described at the top of decode.cu), warp and block reductions,
// the int8 quantization of a block of 32 as the CPU does it, and dependent launch's waits.
// Included by decode.cu and prefill.cu (scripts/build-ptx.py passes this folder to NVRTC).

#pragma once

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

// f32 -> half, rounded to nearest even (the CPU's `ggml::f32_to_f16`).
__device__ __forceinline__ f16 f2h(float f) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// What the KV cache holds (the host's `KvPrecision::kernel_code`): f32 rows, int8 blocks of 32
// with their scales, or half rows.
enum { KV_F32 = 0, KV_I8 = 1, KV_F16 = 2 };

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14
};

// The 6-bit scale `sc` and min `mn` of block g (0..7) of a Q4_K/Q5_K super-block from its 12
// bytes of scales as three words s0, s1, s2 (ggml's get_scale_min_k4).
__device__ __forceinline__ void k4_scale_min(u32 s0, u32 s1, u32 s2, int g, int& sc, int& mn) {
    int sh = 8 * (g & 3);
    u32 a = (s0 >> sh) & 0xff, b = (s1 >> sh) & 0xff, c = (s2 >> sh) & 0xff;
    if (g < 4) {
        sc = a & 63;
        mn = b & 63;
    } else {
        sc = (c & 15) | ((a >> 6) << 4);
        mn = (c >> 4) | ((b >> 6) << 4);
    }
}

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

// The value each lane of a full warp holds, quantized as one block of 32 (lane = position),
// exactly as the CPU's quantize_q8 and kv::quantize_head: this lane's int8, the block's scale
// in `d`.
__device__ __forceinline__ int quant32(float v, float& d) {
    float amax = warp_max(fabsf(v));
    d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    return (int)roundf(v * id);
}

// `quant32` into block `blk` of an activation's int8 blocks, with the block's integer sum.
__device__ __forceinline__ void quant_lane(float v, int blk, i8* qs, float* qd, int* qsum) {
    float d;
    int q = quant32(v, d);
    qs[blk * 32 + (threadIdx.x & 31)] = (i8)q;
    int s = warp_isum(q);
    if ((threadIdx.x & 31) == 0) {
        qd[blk] = d;
        qsum[blk] = s;
    }
}

// Programmatic dependent launch (sm_90: H100/H200; engine.rs `DependentLaunch`). The host
// may launch each kernel while the one before still runs; the kernel then reads and writes
// nothing of the step (activations, counters, KV cache) before `pdl_wait`, which returns once
// the kernel before has finished and its writes are visible. Only weights, which never change,
// and the step's state (token and position) may be read first: only the step's last kernel
// writes the state, once every other kernel of the step has finished, and the step's first
// kernel starts only once the step before has finished (engine/cuda_launch.rs `record_embed`:
// an ordered launch), so it is fixed while the step's kernels run (attention reads the
// position first, docs/HIL.md round 36). `pdl`: 0 = off (the launch did not ask; the wait
// returns at once); 1 = on: the next kernel may launch as soon as all of this one's blocks
// run; 2 = on, and each product block also pulls its first weights into L2 while it waits (an
// ablation: it helped the smallest model and slowed the big products, docs/HIL.md round 10).
// Older architectures compile neither instruction, and their host never asks.
enum { PDL_OFF = 0, PDL_ON = 1, PDL_PREFETCH = 2 };

__device__ __forceinline__ void pdl_launch_next() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The start of a kernel that touches no weights before it waits.
__device__ __forceinline__ void pdl_start(int pdl) {
    if (pdl != PDL_OFF) pdl_launch_next();
    pdl_wait();
}

// Thread block clusters (sm_90): the blocks of a cluster run at once on one GPC and read and
// write each other's shared memory. A split attention whose slices are a cluster joins them
// there, and a gate/up tile's blocks hand their rows to the tile's first block
// (FIN_SWIGLU_CLUSTER), after a hardware barrier, instead of through L2 (a fence, a counter,
// the last block's loads). Older architectures compile none of it; their host never launches
// clusters.
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
// Stores v at `p` (this block's shared memory) in the shared memory of the cluster's block
// `rank`; visible there after the next `cluster_sync`.
__device__ __forceinline__ void st_cluster(float* p, unsigned rank, float v) {
#if __CUDA_ARCH__ >= 900
    unsigned a = (unsigned)__cvta_generic_to_shared(p), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" : : "r"(r), "f"(v) : "memory");
#endif
}
// This block's rank in its cluster (0 outside a cluster).
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}

// Pulls the 128-byte line holding `p` into L2.
__device__ __forceinline__ void prefetch_line(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" : : "l"(p));
}

// Pulls this block's share of `bytes` from `p` into L2 with one bulk prefetch of its first
// thread (sm_90's TMA: one instruction however many lines, so the block's own loads lose no
// issue slots to it): the weights of the product after this one, while this one's loads leave
// the memory idle between rounds (engine/cuda_launch.rs `prefetch_ahead`). `p` is 16-byte aligned
// and `bytes` a multiple of 16 (the host's). Older architectures compile nothing.
__device__ __forceinline__ void prefetch_ahead(const void* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0 || bytes == 0) return;
    unsigned share = ((bytes + gridDim.x - 1) / gridDim.x + 15) & ~15u;
    unsigned from = blockIdx.x * share;
    if (from >= bytes) return;
    unsigned n = min(share, bytes - from);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                 :
                 : "l"((const char*)p + from), "r"(n)
                 : "memory");
#endif
}

// The step's timeline (`leanstream gpu-timeline`, engine/cuda_timeline.rs): launch `slot`'s four
// %globaltimer readings in `trace` (0: off), made by each block's first thread: the first
// block's start (TRACE_START), the first and the last block's return from the wait for the
// kernel before (TRACE_WAITED), and the last block's end (TRACE_END). Calls name the kernel's
// own parameters, so nothing is held in registers across the kernel for them.
enum { TRACE_START, TRACE_WAITED, TRACE_END };
__device__ __forceinline__ void trace_mark(unsigned long long* trace, int slot, int what) {
    if (!trace || threadIdx.x != 0) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(now));
    unsigned long long* t = trace + 4 * slot;
    if (what == TRACE_START) atomicMin(t, now);
    if (what == TRACE_WAITED) {
        atomicMin(t + 1, now);
        atomicMax(t + 2, now);
    }
    if (what == TRACE_END) atomicMax(t + 3, now);
}

// One value of row `r`, column `c` of a matrix in the layout of decode.cu's header.
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
        if (type == T_Q6_K) {
            int jj = j & 15;
            v |= ((qh[2 * b + (j >> 4)] >> (8 * (jj & 3) + 2 * (jj >> 2))) & 3) << 4;
            float sc = (float)((const i8*)m)[2 * b + (j >> 4)];
            return h2f(d[b >> 3]) * sc * (float)(v - 32);
        }
        if (type == T_Q4_K || type == T_Q5_K) {
            // As ggml's dequantize_row_q4_K: (d * sc) * q - dmin * m.
            const u32* hd = (const u32*)(d + (size_t)(b >> 3) * 8);
            int sc, mn;
            k4_scale_min(hd[1], hd[2], hd[3], b & 7, sc, mn);
            if (type == T_Q5_K) v |= ((qh[b] >> j) & 1) << 4;
            return h2f(hd[0] & 0xffff) * (float)sc * (float)v - h2f(hd[0] >> 16) * (float)mn;
        }
        v |= ((qh[b] >> j) & 1) << 4;
        if (type == T_Q5_1) return h2f(d[b]) * (float)v + h2f(m[b]);
        return h2f(d[b]) * (float)(v - 16);
    }
    }
}


__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
