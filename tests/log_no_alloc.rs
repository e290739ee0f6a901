//! The logging hot path (`log_*!` macros -> `sys::log::record`) must not
//! allocate: a counting global allocator watches a burst of log calls,
//! including ring overflow, level filtering and every argument kind.
//! `harness = false` so no test-runner thread allocates concurrently.

use leanstream::sys::log::{self, Level, RING, RING_CAPACITY};
use leanstream::{log_debug, log_error, log_info, log_warn};

use leanstream::serve::alloc_count::{self, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn main() {
    log::set_max_level(Level::Info);
    alloc_count::reset();
    alloc_count::arm();
    for i in 0..(3 * RING_CAPACITY as u64) {
        log_info!("request {} done: {} tokens", i, 17u32);
        log_warn!("kv cache {} of {} ({})", 0.75f32, 2048usize, "fp16");
        log_error!("code {} fatal {}", -5i32, false);
        log_debug!("filtered {}", i);
    }
    alloc_count::disarm();
    assert_eq!(alloc_count::count(), 0, "the log hot path allocated");
    assert_eq!(RING.len(), RING_CAPACITY);
    assert_eq!(
        RING.dropped_total(),
        3 * 3 * RING_CAPACITY as u64 - RING_CAPACITY as u64
    );
    // The writer side may allocate; it reports the drops and the last records.
    let mut out = Vec::new();
    RING.drain_to(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("<4>log: 2048 records dropped"),
        "{}",
        &text[..80]
    );
    assert!(text.contains("] request 767 done: 17 tokens\n"));
    assert!(text.contains("] kv cache 0.750 of 2048 (fp16)\n"));
    assert!(text.contains("<3>["));
    assert!(!text.contains("filtered"));
    println!(
        "log_no_alloc: ok ({} log calls, 0 allocations)",
        4 * 3 * RING_CAPACITY
    );
}
