// The streaming FFN on the GPU (firmware/backend/cuda/stream_ffn.rs; paper 3.2.1): one layer's
// sparse FFN over bundles that arrive while the kernel runs.
//
// A bundle is one block of P neurons as the flash image stores it, three f16 matrices back to
// back: gate rows [P][dim], up rows [P][dim], down columns [P][dim] (neuron-major, so one
// neuron's down contribution is one contiguous row). f16 because that is how the bytes land
// (an I/O lane reads a bundle straight into the memory the kernel reads: no repack on the way),
// and neuron-major down so that a bundle is self-contained.
//
// `stream_ffn` is persistent: each thread block repeatedly claims the first bundle (in priority
// order = bundle index) whose arrival flag is set and that no other block claimed (each block
// probing from its own rotation, so they do not all race for one), so bundles are computed as
// they arrive whatever order they land in. Every wait is bounded by
// time (%globaltimer); a block that sees no progress within the bound reports 1 + the first
// bundle still missing and every block then stops. Each bundle's part is added into one f32
// accumulator; when a stage's last bundle is in, its completion flag (mapped host memory) is
// published with release semantics, after the stage's sums.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short f16;

__device__ __forceinline__ float h2f(f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u32 load_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 load_acquire_gpu(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release_gpu(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Whether flag f (host memory) has reached `want`: a device-memory mirror `seen` answers once
// any block has seen it, so each flag crosses the bus about once per launch, not once per probe.
__device__ __forceinline__ bool arrived(const u32* arrive, u32* seen, u32 f, u32 want) {
    if (load_acquire_gpu(seen + f) != 0) return true;
    if (load_acquire(arrive + f) < want) return false;
    store_release_gpu(seen + f, 1u);
    return true;
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// 8 halves past L1 (a bundle copied in after the kernel started must not be read stale).
__device__ __forceinline__ uint4 ld_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ u32 ld_cg_u32(const u32* p) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float dot8(uint4 p, const float* x) {
    float s = h2f(p.x & 0xffff) * x[0] + h2f(p.x >> 16) * x[1];
    s += h2f(p.y & 0xffff) * x[2] + h2f(p.y >> 16) * x[3];
    s += h2f(p.z & 0xffff) * x[4] + h2f(p.z >> 16) * x[5];
    s += h2f(p.w & 0xffff) * x[6] + h2f(p.w >> 16) * x[7];
    return s;
}

// Bundle `b` into acc: each warp takes neurons w, w + warps, ...: gate and up dots against the
// input in shared memory, a = silu(g) * u kept where |a| >= thr (less the neuron's dropped
// mean, when `mean` is set: the caller adds every neuron's mean contribution once, so a
// dropped neuron counts with its mean, as the CPU's sparse FFN); then every thread sums its
// output columns over the kept neurons and adds them in. `act` is P floats of shared memory.
__device__ __forceinline__ float kept(float a, float thr, const float* mean, int n) {
    return fabsf(a) >= thr ? a - (mean ? mean[n] : 0.f) : 0.f;
}

__device__ void bundle_ffn(const f16* __restrict__ bundle, int P, int dim, const float* xs,
                           float thr, const float* mean, float* act, float* acc) {
    int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const f16* gate = bundle;
    const f16* up = bundle + (size_t)P * dim;
    const f16* down = bundle + (size_t)2 * P * dim;
    for (int n = w; n < P; n += warps) {
        const uint4* g = (const uint4*)(gate + (size_t)n * dim);
        const uint4* u = (const uint4*)(up + (size_t)n * dim);
        float sg = 0.f, su = 0.f;
        for (int i = lane; i < dim / 8; i += 32) {
            sg += dot8(ld_cg(g + i), xs + 8 * i);
            su += dot8(ld_cg(u + i), xs + 8 * i);
        }
        sg = warp_sum(sg);
        su = warp_sum(su);
        if (lane == 0) {
            float a = sg / (1.0f + expf(-sg)) * su;
            act[n] = kept(a, thr, mean, n);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < dim / 2; c += blockDim.x) {
        float s0 = 0.f, s1 = 0.f;
        for (int n = 0; n < P; n++) {
            float a = act[n];
            if (a == 0.f) continue;
            u32 two = ld_cg_u32((const u32*)(down + (size_t)n * dim) + c);
            s0 += a * h2f(two & 0xffff);
            s1 += a * h2f(two >> 16);
        }
        if (s0 != 0.f) atomicAdd(acc + 2 * c, s0);
        if (s1 != 0.f) atomicAdd(acc + 2 * c + 1, s1);
    }
    __syncthreads();
}

// GGML type ids of the rows a bundle may hold (model/ggml.rs).
#define TY_F16 1
#define TY_Q8_0 8

// Bytes of one row of `dim` values of type `ty`.
__device__ __forceinline__ int row_bytes(int ty, int dim) {
    return ty == TY_Q8_0 ? dim / 32 * 34 : 2 * dim;
}

__device__ __forceinline__ u32 ld_cg_u8(const unsigned char* p) {
    u32 v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ f16 ld_cg_f16(const unsigned char* p) {
    unsigned short v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// Value i of a row of type ty (F16 or Q8_0: int8 values in blocks of 32, each after its f16
// scale), read past L1.
__device__ __forceinline__ float row_value(const unsigned char* row, int ty, int i) {
    if (ty == TY_Q8_0) {
        const unsigned char* blk = row + (i / 32) * 34;
        return h2f(ld_cg_f16(blk)) * (float)(signed char)ld_cg_u8(blk + 2 + i % 32);
    }
    return h2f(ld_cg_f16(row + 2 * i));
}

// bundle_ffn over a block as the flash image stores it: P gate rows, P up rows and P down
// columns, each of its own type (F16 or Q8_0), back to back. All-F16 blocks take bundle_ffn's
// vector loads.
__device__ void block_ffn(const unsigned char* __restrict__ block, int P, int dim, int gt, int ut,
                          int dt, const float* xs, float thr, const float* mean, float* act,
                          float* acc) {
    if (gt == TY_F16 && ut == TY_F16 && dt == TY_F16) {
        bundle_ffn((const f16*)block, P, dim, xs, thr, mean, act, acc);
        return;
    }
    int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int gb = row_bytes(gt, dim), ub = row_bytes(ut, dim), db = row_bytes(dt, dim);
    const unsigned char* gate = block;
    const unsigned char* up = block + (size_t)P * gb;
    const unsigned char* down = up + (size_t)P * ub;
    for (int n = w; n < P; n += warps) {
        float sg = 0.f, su = 0.f;
        for (int i = lane; i < dim; i += 32) {
            sg += row_value(gate + (size_t)n * gb, gt, i) * xs[i];
            su += row_value(up + (size_t)n * ub, ut, i) * xs[i];
        }
        sg = warp_sum(sg);
        su = warp_sum(su);
        if (lane == 0) {
            float a = sg / (1.0f + expf(-sg)) * su;
            act[n] = kept(a, thr, mean, n);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float s = 0.f;
        for (int n = 0; n < P; n++) {
            float a = act[n];
            if (a == 0.f) continue;
            s += a * row_value(down + (size_t)n * db, dt, c);
        }
        if (s != 0.f) atomicAdd(acc + c, s);
    }
    __syncthreads();
}

// The input into shared memory (once per block).
__device__ void stage_input(const float* x, int dim, float* xs) {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
}

// Bundle b is done: count it in its stage and, once all of the stage's bundles are, copy the
// accumulator so far into the stage's snapshot (host memory, when given: what the CPU refines
// the next layer's reads from, Algorithm 1) and publish the stage. Called by every thread.
__device__ void finish_bundle(int b, const u32* stage_of, const u32* stage_size, u32* stage_count,
                              u32* stage_flags, u32 want, const float* acc, int dim,
                              float* snapshots, volatile int* last) {
    if (stage_flags == 0) return;
    u32 s = stage_of[b];
    __threadfence();  // every thread's sums before the stage count
    __syncthreads();
    if (threadIdx.x == 0) *last = atomicAdd(stage_count + s, 1u) + 1 == stage_size[s];
    __syncthreads();
    if (!*last) return;
    if (snapshots != 0) {
        __threadfence();
        for (int c = threadIdx.x; c < dim; c += blockDim.x)
            snapshots[(size_t)s * dim + c] = atomicAdd((float*)acc + c, 0.f);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        __threadfence_system();
        store_release(stage_flags + s, want);
    }
}

// Dynamic shared memory: dim floats (the input) + P floats (activations) + 4 ints.
//
// bundles: n bundles of P neurons; bundle b is at bundles + stride * (slot_of ? slot_of[b] : b)
// bytes (slot_of, in host memory, is read after b's arrival: the cache slot a lane put it in),
// its gate rows, up rows and down columns of types gt, ut, dt (F16 or Q8_0). arrive: n flags
// read as arrive[flag_of[b]] >= want (null: all arrived, the bundles are resident).
// claimed: 2n + 1 words, zero at launch (the claims, the mirror of the flags seen set, and
// the count of claims so far).
// stage_*: per-bundle stage index, bundles per stage, per-stage counters (zero at launch) and
// the completion flags (null: not published); snapshots: per stage, dim floats of the
// accumulator when the stage completed (null: none). error: 0, or 1 + the first bundle
// missing at timeout; a host that knows a bundle will never come sets it first. report (host
// memory, or null): where a timeout's error word is copied, when `error` is device memory.
// means (or null): the layer's dropped-neuron means by image slot (block * P + entry), and
// order: bundle b's block in the layer.
extern "C" __global__ void stream_ffn(const unsigned char* __restrict__ bundles, size_t stride,
                                      const u32* slot_of, int n, int P, int dim, int gt, int ut,
                                      int dt, const float* __restrict__ x, float thr, float* acc,
                                      const u32* arrive, const u32* flag_of, u32 want,
                                      u32* claimed, const u32* stage_of, const u32* stage_size,
                                      u32* stage_count, u32* stage_flags, float* snapshots,
                                      u64 timeout_ns, u32* error, u32* report,
                                      const u32* order, const float* means) {
    extern __shared__ float shared[];
    float* xs = shared;
    float* act = shared + dim;
    volatile int* pick = (volatile int*)(act + P);
    volatile int* last = pick + 1;
    u32* seen = claimed + n;
    stage_input(x, dim, xs);
    // The first bundle this block may find unclaimed: claims only grow, so it only advances.
    int cursor = 0;
    u64 last_progress = now_ns();
    u32 claims_seen = 0;
    for (;;) {
        if (threadIdx.x < 32) {
            int lane = threadIdx.x, got = -1;
            for (;;) {
                // Lanes probe 32 bundles at a time of those from the cursor on, each block
                // starting at its own rotation (so blocks do not all race for one bundle):
                // unclaimed and arrived?
                int span = n - cursor, first_open = n;
                int rot = span > 0 ? (int)((blockIdx.x * 32u) % (u32)span) : 0;
                for (int j0 = 0; j0 < span && got < 0; j0 += 32) {
                    int j = j0 + lane;
                    int b = cursor + (j + rot) % (span > 0 ? span : 1);
                    bool open = j < span && ((volatile u32*)claimed)[b] == 0;
                    int m = open ? b : n;
                    for (int o = 16; o > 0; o >>= 1) m = min(m, __shfl_xor_sync(0xffffffff, m, o));
                    first_open = min(first_open, m);
                    bool here = open && (arrive == 0 || arrived(arrive, seen, flag_of[b], want));
                    u32 here_mask = __ballot_sync(0xffffffff, here);
                    while (here_mask && got < 0) {
                        int src = __ffs(here_mask) - 1;
                        int cand = __shfl_sync(0xffffffff, b, src);
                        int won = 0;
                        if (lane == 0) {
                            won = atomicCAS(claimed + cand, 0u, 1u) == 0;
                            if (won) atomicAdd(claimed + 2 * n, 1u);  // progress, for waiters
                        }
                        won = __shfl_sync(0xffffffff, won, 0);
                        if (won) got = cand;
                        here_mask &= here_mask - 1;
                    }
                }
                // Stopped early at a claim: bundles before first_open not probed may be open.
                if (got >= 0) first_open = cursor;
                cursor = first_open;
                if (got >= 0 || first_open >= n) break;  // a bundle, or none left to claim
                // Nothing to claim: has another block given up? (The error word is in host
                // memory: read only while waiting, since reads across the bus queue up.)
                if (*(volatile u32*)error != 0) {
                    got = -2;
                    break;
                }
                // The time bound runs from the last claim by any block: a block that waits
                // while others compute is not stalled.
                u32 total = ((volatile u32*)claimed)[2 * n];
                if (total != claims_seen) {
                    claims_seen = total;
                    last_progress = now_ns();
                }
                if (now_ns() > last_progress + timeout_ns) {
                    // Name the first bundle still not arrived.
                    int missing = first_open;
                    if (lane == 0) {
                        for (int b = first_open; b < n; b++) {
                            if (arrive != 0 && ((volatile u32*)claimed)[b] == 0 &&
                                load_acquire(arrive + flag_of[b]) < want) {
                                missing = b;
                                break;
                            }
                        }
                        atomicCAS(error, 0u, (u32)(1 + missing));
                        __threadfence_system();
                        if (report != 0) store_release(report, *(volatile u32*)error);
                    }
                    got = -2;
                    break;
                }
                __nanosleep(100);
            }
            if (lane == 0) {
                *pick = got;
                // Where the bundle is: read after an acquire of its own flag by this thread.
                if (got >= 0 && slot_of != 0) {
                    load_acquire(arrive + flag_of[got]);
                    pick[2] = (int)load_acquire(slot_of + got);
                } else {
                    pick[2] = got;
                }
            }
        }
        __syncthreads();
        int b = *pick;
        u32 slot = (u32)pick[2];
        __syncthreads();
        if (b < 0) return;
        const float* mean = means ? means + (size_t)order[b] * P : 0;
        block_ffn(bundles + stride * slot, P, dim, gt, ut, dt, xs, thr, mean, act, acc);
        finish_bundle(b, stage_of, stage_size, stage_count, stage_flags, want, acc, dim,
                      snapshots, last);
        last_progress = now_ns();
    }
}

// Table 3's baselines over the same bundles, all resident.
//
// `ffn_segment`: bundles [first, first + count) over the grid; one launch per segment, so the
// segments are ordered by kernel boundaries.
extern "C" __global__ void ffn_segment(const f16* __restrict__ bundles, size_t stride, int first,
                                       int count, int P, int dim, const float* __restrict__ x,
                                       float thr, float* acc) {
    extern __shared__ float shared[];
    float* xs = shared;
    stage_input(x, dim, xs);
    for (int i = blockIdx.x; i < count; i += gridDim.x)
        bundle_ffn(bundles + stride * (first + i), P, dim, xs, thr, 0, shared + dim, acc);
}

// A grid-wide barrier: valid only under a cooperative launch (every block resident). bar[0]
// counts arrivals, bar[1] is the generation; both zero at launch.
__device__ void grid_barrier(u32* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 gen = ((volatile u32*)bar)[1];
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (((volatile u32*)bar)[1] == gen) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

// `ffn_segments_coop`: all segments in one cooperative launch, a grid barrier after each (what
// a segment boundary costs when every block must wait for the segment's load). seg_start has
// segments + 1 entries.
extern "C" __global__ void ffn_segments_coop(const f16* __restrict__ bundles, size_t stride,
                                             const u32* seg_start, int segments, int P, int dim,
                                             const float* __restrict__ x, float thr, float* acc,
                                             u32* bar) {
    extern __shared__ float shared[];
    float* xs = shared;
    stage_input(x, dim, xs);
    for (int s = 0; s < segments; s++) {
        int first = seg_start[s], count = seg_start[s + 1] - first;
        for (int i = blockIdx.x; i < count; i += gridDim.x)
            bundle_ffn(bundles + stride * (first + i), P, dim, xs, thr, 0, shared + dim, acc);
        grid_barrier(bar);
    }
}
