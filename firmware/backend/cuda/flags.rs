//! Flags shared by CPU threads and running kernels: 32-bit words in pinned, device-mapped host
//! memory (on a Jetson, the one memory both see). The host side stores with Release and loads
//! with Acquire; the kernels (kernels-ptx/flags.cu) use `ld.acquire.sys` / `st.release.sys`.
//! Waits on both sides are bounded by time and end in an error, never a hang. This is the
//! primitive the streaming pipeline's I/O lanes and GPU blocks will coordinate through.

use super::driver::{CudaResult, Gpu, MappedHost};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub struct Flags {
    mem: MappedHost,
    n: usize,
}

impl Flags {
    /// `n` flags, all zero.
    pub fn new(gpu: &Gpu, n: usize) -> CudaResult<Flags> {
        Ok(Flags {
            mem: gpu.alloc_mapped(n * 4)?,
            n,
        })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The device address of flag 0, for kernel arguments.
    pub fn device_ptr(&self) -> u64 {
        self.mem.dev
    }

    fn atom(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.n, "flag {i} of {}", self.n);
        // SAFETY: the mapping is 4-byte aligned (page aligned), spans n words and lives as long
        // as self; the GPU accesses the same words only with atomic-width loads and stores.
        unsafe { AtomicU32::from_ptr((self.mem.host as *mut u32).add(i)) }
    }

    /// Publishes flag `i` = `v`: everything written before is visible to a kernel that sees it.
    pub fn set(&self, i: usize, v: u32) {
        self.atom(i).store(v, Ordering::Release);
    }

    pub fn get(&self, i: usize) -> u32 {
        self.atom(i).load(Ordering::Acquire)
    }

    /// Waits until flag `i` >= `want`; `Err` with the value last seen after `timeout`.
    pub fn wait(&self, i: usize, want: u32, timeout: Duration) -> Result<(), u32> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.get(i);
            if v >= want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(v);
            }
            std::hint::spin_loop();
        }
    }
}
