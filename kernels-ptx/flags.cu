// Flags between CPU threads and a running kernel, in pinned, device-mapped host memory
// (firmware/backend/cuda/flags.rs). The GPU side reads with acquire and writes with release at
// system scope, so a flag's data is visible before the flag is; every wait is bounded by time
// (%globaltimer, ns), never by a count: one spin across PCIe costs microseconds.

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 load_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// Waits until flags[i] >= want, up to timeout_ns. Returns 1 if seen, 0 on timeout.
__device__ int wait_flag(const u32* flags, int i, u32 want, u64 deadline) {
    while (load_acquire(flags + i) < want) {
        if (now_ns() > deadline) return 0;
        __nanosleep(200);
    }
    return 1;
}

// Thread i waits for host_flags[i] >= want, then answers reply[i] = want. A thread that gives
// up writes `error[0] = 1 + i` (the first to fail wins) and returns without answering.
extern "C" __global__ void flag_echo(const u32* host_flags, u32* reply, int n, u32 want,
                                     u64 timeout_ns, u32* error) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 deadline = now_ns() + timeout_ns;
    if (!wait_flag(host_flags, i, want, deadline)) {
        atomicCAS(error, 0u, (u32)(1 + i));
        __threadfence_system();
        return;
    }
    store_release(reply + i, want);
}
