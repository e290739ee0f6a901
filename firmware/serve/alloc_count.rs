//! A global allocator that counts heap allocations while armed, so the daemon can show in
//! `/metrics` that serving allocates nothing after boot, and the no-allocation tests can assert
//! it. Counting is one relaxed atomic add per allocation; a binary opts in with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct CountingAllocator;

static ARMED: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are atomics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        if ARMED.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

/// Start counting (the count is kept; see [`reset`]).
pub fn arm() {
    ARMED.store(true, Ordering::SeqCst);
}

/// Stop counting.
pub fn disarm() {
    ARMED.store(false, Ordering::SeqCst);
}

/// Allocations counted while armed since the last [`reset`].
pub fn count() -> u64 {
    COUNT.load(Ordering::SeqCst)
}

pub fn reset() {
    COUNT.store(0, Ordering::SeqCst);
}

/// Counts the allocations `f` makes (every thread's, while it runs).
pub fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
    reset();
    arm();
    let r = f();
    disarm();
    (r, count())
}

/// Allocations counted so far, or None when this allocator is not the process's.
pub fn allocations_after_boot() -> Option<u64> {
    if INSTALLED.load(Ordering::Relaxed) {
        Some(COUNT.load(Ordering::Relaxed))
    } else {
        None
    }
}
