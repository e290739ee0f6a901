//! Streaming allocates nothing after construction: a counting global allocator watches many
//! rounds of requests, re-ranking, cancelling, reads completing out of order, retried and failed
//! reads, and cache evictions, under pread and (where the kernel has it) io_uring.
//! `harness = false` so no test-runner thread allocates concurrently.

mod stream_common;

use leanstream::serve::alloc_count::{self, CountingAllocator};
use leanstream::stream::fault::{Fault, FaultBackend, FaultKind};
use leanstream::stream::{BlockRead, LaneConfig, Lanes, Policy, ReadErrorKind, WeightCache};
use stream_common::*;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const N: u32 = 64;
const SLOTS: usize = 24;

fn main() {
    let (_dir, path) = block_file(N);
    // Adjacent blocks leave as merged reads of up to 4 (their split retries included).
    let cfg = LaneConfig {
        merge_blocks: 4,
        ..config(2, 4)
    };
    for (policy, inner) in [Policy::Lru, Policy::Hot]
        .into_iter()
        .zip(backends(&cfg, "no-alloc"))
    {
        let name = inner.name();
        let mut rig = Rig::new(&cfg, SLOTS, N as usize);
        let (mut cache, staging) = rig.parts(policy, &[0, 1, 2, 3]);
        let backend = FaultBackend::new(inner, N as usize, 8)
            .with_fault(Fault {
                block: 13,
                attempts: u32::MAX,
                kind: FaultKind::Eio,
            })
            .with_fault(Fault {
                block: 14,
                attempts: u32::MAX,
                kind: FaultKind::Short(100),
            })
            .shuffled(11);
        let mut lanes = Lanes::new(cfg, staging, N as usize, Box::new(backend)).unwrap();
        let file = lanes.open(&path).unwrap();
        let mut prio = [0.0f32; N as usize];
        let mut x = 0x9e37_79b9_u64;
        let mut run_round =
            |lanes: &mut Lanes, cache: &mut WeightCache, round: u64| -> (u64, u64) {
                let (mut ok, mut failed) = (0, 0);
                for k in 0..20u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let b = ((x % N as u64) / (1 + k % 3)) as u32; // skewed towards low ids
                    let read = BlockRead {
                        file,
                        offset: b as u64 * BLOCK as u64,
                        len: BLOCK as u32,
                        block: b,
                    };
                    lanes
                        .request(read, 1.0 + (k ^ round) as f32, cache)
                        .unwrap();
                    prio[b as usize] = if k % 5 == 0 { 0.0 } else { 2.0 + k as f32 };
                }
                lanes.rerank(&prio);
                lanes.cancel((round % N as u64) as u32);
                while let Some(a) = lanes.wait_next(cache).unwrap() {
                    match a.result {
                        Ok(slot) => {
                            assert_eq!(&cache.slot(slot)[..4], &a.block.to_le_bytes());
                            ok += 1;
                        }
                        Err(e) => {
                            assert!(matches!(
                                e.kind,
                                ReadErrorKind::Io(_) | ReadErrorKind::Short { .. }
                            ));
                            assert!(e.block == 13 || e.block == 14);
                            failed += 1;
                        }
                    }
                }
                prio.fill(0.0);
                (ok, failed)
            };
        // Warm-up: the first round may touch lazily set-up state (the log ring, the kernel).
        run_round(&mut lanes, &mut cache, 0);
        alloc_count::reset();
        alloc_count::arm();
        let (mut ok, mut failed) = (0, 0);
        for round in 1..200 {
            let (o, f) = run_round(&mut lanes, &mut cache, round);
            ok += o;
            failed += f;
        }
        alloc_count::disarm();
        let allocs = alloc_count::count();
        let s = cache.stats();
        assert_eq!(allocs, 0, "{name}: streaming allocated {allocs} times");
        assert!(
            ok > 500 && failed > 10,
            "{name}: {ok} reads, {failed} failed"
        );
        assert!(s.evictions > 100 && s.hits > 100, "{name}: {s:?}");
        println!(
            "stream_no_alloc: ok ({name}, {policy}: {ok} reads, {failed} failed, {} evictions, 0 allocations)",
            s.evictions
        );
    }
}
