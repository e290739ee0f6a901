//! A fixed worker pool, created once at boot.
//!
//! `run(n_tasks, f)` calls `f(i)` for every `i` in `0..n_tasks`, spread over the pool's workers
//! and the calling thread, and returns when all calls are done. A decode step dispatches a few
//! hundred short runs (10-50 us each), so dispatch is built for latency:
//!
//! - The job (closure, task count, claim counter) lives on the caller's stack; a run publishes a
//!   pointer to it and bumps an atomic generation counter. Nothing is allocated per run.
//! - Idle workers spin on the generation counter (with `std::hint::spin_loop`) for a while
//!   (`spin`, default 200 us) before parking on a condvar; `run` wakes parked workers.
//! - Tasks are claimed one at a time from an atomic counter, so uneven tasks balance.
//! - A worker enters a run through an admission word (run id, closed bit, count of workers
//!   inside). Once all tasks are claimed, `run` waits for the workers inside to leave and closes
//!   the run; late workers (parked, or descheduled on a busy machine) are not waited for.
//!
//! Panics: a panic in `f` is caught on whichever thread ran it; the other threads stop claiming
//! tasks, all threads finish, and then `run` panics on the calling thread (re-raising the
//! payload when the panic happened on the calling thread, or with "worker pool: a task
//! panicked" when it happened on a worker, whose own message the panic hook already printed).
//! The pool stays usable afterwards. Nothing deadlocks. (With `panic = "abort"` the process
//! simply aborts, as usual.)

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking, unless set with [`WorkerPool::with_spin`].
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// One run, on the stack of the thread that called `run`.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n_tasks: usize,
    /// Next task index to claim.
    next: AtomicUsize,
    /// Some thread's call of `f` panicked.
    panicked: AtomicBool,
}

impl Job<'_> {
    /// Claims and runs tasks until none are left. Returns the panic payload if `f` panicked.
    fn work(&self) -> Result<(), Box<dyn std::any::Any + Send>> {
        panic::catch_unwind(AssertUnwindSafe(|| loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n_tasks {
                return;
            }
            (self.f)(i);
        }))
        .inspect_err(|_| {
            self.panicked.store(true, Ordering::Relaxed);
            // Let the other threads stop early.
            self.next.store(usize::MAX / 2, Ordering::Relaxed);
        })
    }
}

/// `Shared::entry` packs the run's id (low 32 bits of its generation) in the high half, a
/// CLOSED bit, and the number of workers inside the job in the low bits.
const CLOSED: u64 = 1 << 31;

fn entry_of(generation: usize) -> u64 {
    (generation as u32 as u64) << 32
}

struct Shared {
    /// Bumped once per run, and once at shutdown.
    generation: AtomicUsize,
    /// Admission to the current run's job; see `CLOSED`.
    entry: AtomicU64,
    /// The current run's job; valid while a worker is admitted (see `worker_loop`).
    job: AtomicPtr<Job<'static>>,
    shutdown: AtomicBool,
    /// Parked workers (incremented under `lock`).
    sleepers: AtomicUsize,
    /// Workers that have entered `worker_loop` (their thread start-up, which allocates, is over).
    started: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    spin: Duration,
}

pub struct WorkerPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// A pool of `n_threads` threads in all: spawns `n_threads - 1` workers; the thread calling
    /// `run` is the last one. `n_threads` 0 is taken as 1.
    pub fn new(n_threads: usize) -> WorkerPool {
        WorkerPool::with_spin(n_threads, DEFAULT_SPIN)
    }

    /// As `new`, with idle workers spinning for `spin` before they park.
    pub fn with_spin(n_threads: usize, spin: Duration) -> WorkerPool {
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            entry: AtomicU64::new(CLOSED),
            job: AtomicPtr::new(std::ptr::null_mut()),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            spin,
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("leanstream-cpu-{i}"))
                    .spawn(move || worker_loop(&shared))
                    .expect("spawning a worker thread")
            })
            .collect::<Vec<_>>();
        // Boot waits for every worker to be up: a thread's start-up allocates (its thread-local
        // destructors list), and that must not happen later, in the middle of decoding.
        while shared.started.load(Ordering::Acquire) < workers.len() {
            std::thread::sleep(Duration::from_micros(100));
        }
        WorkerPool { shared, workers }
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `f(i)` for every `i` in `0..n_tasks` across the pool's threads (the calling thread
    /// included); returns when all calls are done. See the module doc for panics.
    ///
    /// Workers that are slow to arrive (parked, or descheduled on a busy machine) are not
    /// waited for: once every task is claimed and no worker is inside the job, the job is
    /// closed and `run` returns.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let job = Job {
            f,
            n_tasks,
            next: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        };
        let sh = &*self.shared;
        let gen = sh.generation.load(Ordering::Relaxed).wrapping_add(1);
        // Lifetime erased here; `worker_loop` documents why the pointer stays valid.
        sh.job
            .store((&job as *const Job).cast_mut().cast(), Ordering::Relaxed);
        sh.entry.store(entry_of(gen), Ordering::SeqCst);
        sh.generation.store(gen, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            // A worker increments `sleepers` under the lock, then re-checks the generation
            // before waiting; taking the lock here means it is either waiting (and gets this
            // notification) or will see the new generation.
            drop(sh.lock.lock().unwrap_or_else(|e| e.into_inner()));
            sh.wake.notify_all();
        }
        let mine = job.work();
        // All tasks are claimed. Wait for the admitted workers to leave, and close the job so
        // no other worker enters: from then on no worker touches `job`, which is the invariant
        // that keeps the pointer published above valid for as long as any worker uses it.
        let mut spins = 0u32;
        loop {
            let e = sh.entry.load(Ordering::Acquire);
            if e & !CLOSED == entry_of(gen)
                && sh
                    .entry
                    .compare_exchange_weak(e, e | CLOSED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        sh.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if let Err(payload) = mine {
            panic::resume_unwind(payload);
        }
        if job.panicked.load(Ordering::Relaxed) {
            panic!("worker pool: a task panicked");
        }
    }
}

fn worker_loop(sh: &Shared) {
    // Touch what a thread sets up lazily (its handle and thread-local destructors) before
    // saying we are up.
    let _ = std::thread::current().id();
    sh.started.fetch_add(1, Ordering::Release);
    let mut seen = 0usize;
    loop {
        // Wait for a new generation: spin, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        let mut gen = sh.generation.load(Ordering::Acquire);
        while gen == seen {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && start.elapsed() >= sh.spin {
                let mut guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
                sh.sleepers.fetch_add(1, Ordering::SeqCst);
                loop {
                    gen = sh.generation.load(Ordering::SeqCst);
                    if gen != seen {
                        break;
                    }
                    guard = sh.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                sh.sleepers.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            gen = sh.generation.load(Ordering::Acquire);
        }
        seen = gen;
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Enter run `gen` unless it is closed or already replaced by a later one.
        let mut e = sh.entry.load(Ordering::Acquire);
        let admitted = loop {
            if e & CLOSED != 0 || e & !(CLOSED | 0xFFFF_FFFF) != entry_of(gen) {
                break false;
            }
            match sh
                .entry
                .compare_exchange_weak(e, e + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => e = now,
            }
        };
        if !admitted {
            continue;
        }
        let job = sh.job.load(Ordering::Relaxed);
        // SAFETY: `run` stored a pointer to its stack `Job` before publishing `entry` for this
        // run (SeqCst store / our Acquire CAS orders the `job` store before this load), and we
        // were admitted while the entry was open. `run` does not return, so the `Job` and the
        // closure it borrows stay alive, until it has closed the entry, which it can only do
        // once our count is gone, i.e. after our decrement below, our last access to the job.
        let job = unsafe { &*job };
        // A worker's panic is reported through `job.panicked`; the hook already printed it.
        let _ = job.work();
        sh.entry.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::Release);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        drop(sh.lock.lock().unwrap_or_else(|e| e.into_inner()));
        sh.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn check_all_once(pool: &WorkerPool, n: usize) {
        let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        pool.run(n, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn many_tasks_each_once() {
        for threads in [1, 2, 3, 5] {
            let pool = WorkerPool::new(threads);
            assert_eq!(pool.n_threads(), threads);
            for n in [0, 1, 2, 7, 100, 10_000] {
                check_all_once(&pool, n);
            }
        }
    }

    #[test]
    fn repeated_runs_sum() {
        let pool = WorkerPool::new(3);
        let total = AtomicU64::new(0);
        for r in 0..5000u64 {
            pool.run(17, &|i| {
                total.fetch_add(r * 100 + i as u64, Ordering::Relaxed);
            });
        }
        let want: u64 = (0..5000u64)
            .map(|r| 17 * r * 100 + (0..17).sum::<u64>())
            .sum();
        assert_eq!(total.load(Ordering::Relaxed), want);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = WorkerPool::with_spin(3, Duration::from_micros(1));
        for _ in 0..50 {
            std::thread::sleep(Duration::from_micros(200));
            check_all_once(&pool, 64);
        }
    }

    #[test]
    fn tasks_run_on_several_threads() {
        let pool = WorkerPool::new(2);
        let ids = Mutex::new(std::collections::HashSet::new());
        // Tasks long enough that the worker has time to claim some.
        pool.run(64, &|_| {
            std::thread::sleep(Duration::from_millis(1));
            ids.lock().unwrap().insert(std::thread::current().id());
        });
        assert_eq!(ids.lock().unwrap().len(), 2);
    }

    #[test]
    fn panic_propagates_and_pool_survives() {
        let pool = WorkerPool::new(3);
        for bad in [0usize, 37, 99] {
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(100, &|i| {
                    if i == bad {
                        panic!("task {i} fails");
                    }
                })
            }));
            assert!(r.is_err());
            check_all_once(&pool, 100);
        }
    }
}
