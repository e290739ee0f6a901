//! How the lanes submit reads and reap their completions: a small trait with two real backends,
//! io_uring ([`UringBackend`], one ring per lane, staging buffers registered with the kernel)
//! and plain `pread` ([`PreadBackend`], the fallback where io_uring cannot be set up: an old
//! kernel, a seccomp filter, `io_uring_disabled`). Both complete each submission exactly once
//! with the byte count or a negative errno; the fault injector ([`super::fault`]) wraps either.

use std::io;
use std::os::fd::RawFd;

/// One read handed to a backend: `len` bytes at `offset` of `fd` into `buf` (a staging buffer,
/// `buf_index` of lane `lane`'s registered ones).
#[derive(Clone, Copy, Debug)]
pub struct Submission {
    /// Comes back unchanged in the completion.
    pub tag: u64,
    pub lane: usize,
    pub fd: RawFd,
    pub offset: u64,
    pub len: u32,
    pub buf: *mut u8,
    pub buf_index: u16,
    /// The first block being read (for fault injection and diagnostics).
    pub block: u32,
    /// Blocks the read covers: `block`, `block + 1`, ..., each `block_stride` bytes after the
    /// last in the file and in the buffer.
    pub blocks: u16,
    pub block_stride: u32,
}

// SAFETY: `buf` points into the I/O staging arena, which outlives the lanes and their backend;
// the lanes hand each buffer to one read at a time.
unsafe impl Send for Submission {}

/// A finished read: the submission's tag and the byte count read, or `-errno`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: u64,
    pub result: i32,
}

pub trait ReadBackend: Send {
    /// "io_uring", "pread", or a wrapper's name.
    fn name(&self) -> &'static str;

    /// Hands lane `lane`'s staging buffers to the backend once, before any read.
    fn register_buffers(&mut self, lane: usize, bufs: &[(*mut u8, usize)]) -> io::Result<()>;

    /// Queues one read. The lanes keep at most `queue_depth` in flight per lane.
    fn submit(&mut self, sub: Submission) -> io::Result<()>;

    /// Sends queued reads to the kernel (a no-op where `submit` already did).
    fn flush(&mut self) -> io::Result<()>;

    /// Moves finished reads into `out`; returns how many. With `wait`, blocks until at least one
    /// has finished (when any is in flight).
    fn reap(&mut self, out: &mut [Completion], wait: bool) -> io::Result<usize>;
}

/// A fixed-capacity FIFO of completions, for backends that finish reads before they are
/// reaped (pread, injected faults).
pub struct CompletionRing {
    buf: Vec<Completion>,
    head: usize,
    len: usize,
}

impl CompletionRing {
    pub fn with_capacity(n: usize) -> CompletionRing {
        CompletionRing {
            buf: vec![Completion { tag: 0, result: 0 }; n.max(1)],
            head: 0,
            len: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn push(&mut self, c: Completion) {
        assert!(self.len < self.buf.len(), "completion ring overflow");
        let i = (self.head + self.len) % self.buf.len();
        self.buf[i] = c;
        self.len += 1;
    }
    pub fn pop(&mut self) -> Option<Completion> {
        if self.len == 0 {
            return None;
        }
        let c = self.buf[self.head];
        self.head = (self.head + 1) % self.buf.len();
        self.len -= 1;
        Some(c)
    }
    /// Removes and returns the `k`-th oldest (for reordering).
    pub fn take(&mut self, k: usize) -> Completion {
        assert!(k < self.len);
        let n = self.buf.len();
        let c = self.buf[(self.head + k) % n];
        for j in k..self.len - 1 {
            self.buf[(self.head + j) % n] = self.buf[(self.head + j + 1) % n];
        }
        self.len -= 1;
        c
    }
}

/// Reads with `pread` at submission; completions wait in a ring until reaped.
pub struct PreadBackend {
    done: CompletionRing,
}

impl PreadBackend {
    /// Room for `in_flight` reads (lanes x queue depth).
    pub fn new(in_flight: usize) -> PreadBackend {
        PreadBackend {
            done: CompletionRing::with_capacity(in_flight),
        }
    }
}

impl ReadBackend for PreadBackend {
    fn name(&self) -> &'static str {
        "pread"
    }
    fn register_buffers(&mut self, _lane: usize, _bufs: &[(*mut u8, usize)]) -> io::Result<()> {
        Ok(())
    }
    fn submit(&mut self, s: Submission) -> io::Result<()> {
        // SAFETY: `s.buf` is a staging buffer of at least `s.len` bytes, owned by this read until
        // its completion is reaped; `s.fd` is open for the lanes' lifetime.
        let n = loop {
            let n = unsafe {
                nix::libc::pread(
                    s.fd,
                    s.buf.cast(),
                    s.len as usize,
                    s.offset as nix::libc::off_t,
                )
            };
            if n >= 0 {
                break n as i32;
            }
            let errno = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(nix::libc::EIO);
            if errno != nix::libc::EINTR {
                break -errno;
            }
        };
        self.done.push(Completion {
            tag: s.tag,
            result: n,
        });
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn reap(&mut self, out: &mut [Completion], _wait: bool) -> io::Result<usize> {
        let mut n = 0;
        while n < out.len() {
            match self.done.pop() {
                Some(c) => out[n] = c,
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }
}

/// One io_uring per lane, `queue_depth` entries each; reads use `READ_FIXED` on the lane's
/// registered staging buffers (plain `READ` where registration was refused).
pub struct UringBackend {
    rings: Vec<io_uring::IoUring>,
    in_flight: Vec<usize>,
    registered: Vec<bool>,
    /// The next lane a blocking reap waits on, so no lane is starved.
    next_wait: usize,
}

impl UringBackend {
    /// `lanes` rings of `queue_depth` entries; an error where the kernel refuses io_uring.
    pub fn new(lanes: usize, queue_depth: usize) -> io::Result<UringBackend> {
        let entries = (queue_depth.max(1) as u32).next_power_of_two();
        let mut rings = Vec::with_capacity(lanes);
        for _ in 0..lanes {
            rings.push(io_uring::IoUring::new(entries)?);
        }
        // A no-op round trip proves the ring works (a seccomp filter may allow setup only).
        let ring = &mut rings[0];
        let nop = io_uring::opcode::Nop::new().build().user_data(u64::MAX);
        // SAFETY: a NOP references no memory.
        unsafe { ring.submission().push(&nop) }.map_err(|_| io::Error::other("sq full"))?;
        ring.submit_and_wait(1)?;
        let res = ring.completion().next().map(|c| c.result());
        if res != Some(0) {
            return Err(io::Error::other("io_uring NOP did not complete"));
        }
        Ok(UringBackend {
            in_flight: vec![0; lanes],
            registered: vec![false; lanes],
            rings,
            next_wait: 0,
        })
    }

    /// Whether lane `lane`'s buffers are registered with the kernel (READ_FIXED).
    pub fn registered(&self, lane: usize) -> bool {
        self.registered[lane]
    }
}

impl ReadBackend for UringBackend {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn register_buffers(&mut self, lane: usize, bufs: &[(*mut u8, usize)]) -> io::Result<()> {
        let iovecs: Vec<nix::libc::iovec> = bufs
            .iter()
            .map(|&(p, n)| nix::libc::iovec {
                iov_base: p.cast(),
                iov_len: n,
            })
            .collect();
        // SAFETY: the buffers live in the staging arena, which outlives these rings; the kernel
        // pins them until the ring is dropped.
        match unsafe { self.rings[lane].submitter().register_buffers(&iovecs) } {
            Ok(()) => self.registered[lane] = true,
            // Registration pins memory (RLIMIT_MEMLOCK): without it, plain READ still works.
            Err(_) => self.registered[lane] = false,
        }
        Ok(())
    }

    fn submit(&mut self, s: Submission) -> io::Result<()> {
        let fd = io_uring::types::Fd(s.fd);
        let entry = if self.registered[s.lane] {
            io_uring::opcode::ReadFixed::new(fd, s.buf, s.len, s.buf_index)
                .offset(s.offset)
                .build()
        } else {
            io_uring::opcode::Read::new(fd, s.buf, s.len)
                .offset(s.offset)
                .build()
        }
        .user_data(s.tag);
        let ring = &mut self.rings[s.lane];
        // SAFETY: `s.buf` stays valid and untouched by the lanes until this read's completion
        // is reaped.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            ring.submit()?;
            // SAFETY: as above.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.in_flight[s.lane] += 1;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        for ring in &mut self.rings {
            if !ring.submission().is_empty() {
                ring.submit()?;
            }
        }
        Ok(())
    }

    fn reap(&mut self, out: &mut [Completion], wait: bool) -> io::Result<usize> {
        let mut n = 0;
        let lanes = self.rings.len();
        for lane in 0..lanes {
            n = drain(&mut self.rings[lane], &mut self.in_flight[lane], out, n);
        }
        if n == 0 && wait {
            // Block on one lane with reads in flight, taking turns.
            for k in 0..lanes {
                let lane = (self.next_wait + k) % lanes;
                if self.in_flight[lane] == 0 {
                    continue;
                }
                self.next_wait = (lane + 1) % lanes;
                let ring = &mut self.rings[lane];
                loop {
                    match ring.submit_and_wait(1) {
                        Ok(_) => break,
                        Err(e) if e.raw_os_error() == Some(nix::libc::EINTR) => continue,
                        Err(e) => return Err(e),
                    }
                }
                n = drain(ring, &mut self.in_flight[lane], out, n);
                break;
            }
        }
        Ok(n)
    }
}

/// Moves one ring's finished reads into `out[n..]` (no more than fit); the new `n`.
fn drain(
    ring: &mut io_uring::IoUring,
    in_flight: &mut usize,
    out: &mut [Completion],
    mut n: usize,
) -> usize {
    let mut cq = ring.completion();
    while n < out.len() {
        let Some(cqe) = cq.next() else { break };
        out[n] = Completion {
            tag: cqe.user_data(),
            result: cqe.result(),
        };
        *in_flight -= 1;
        n += 1;
    }
    n
}

/// Whether a fallback to pread has been said in the log (once per process).
static FELL_BACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The io_uring backend, or the pread one (said once per process) where io_uring cannot be
/// set up here.
pub fn best_backend(lanes: usize, queue_depth: usize) -> Box<dyn ReadBackend> {
    choose_backend(UringBackend::new(lanes, queue_depth), lanes * queue_depth)
}

/// `uring` when it was set up, else a pread backend for `in_flight` reads, saying why once.
pub fn choose_backend(uring: io::Result<UringBackend>, in_flight: usize) -> Box<dyn ReadBackend> {
    match uring {
        Ok(b) => Box::new(b),
        Err(e) => {
            if !FELL_BACK.swap(true, std::sync::atomic::Ordering::Relaxed) {
                let errno = e.raw_os_error().unwrap_or(0);
                crate::log_warn!(
                    "io_uring is not available here (errno {}): the I/O lanes read with pread",
                    errno
                );
            }
            Box::new(PreadBackend::new(in_flight))
        }
    }
}

/// Whether this process fell back to pread.
pub fn fell_back_to_pread() -> bool {
    FELL_BACK.load(std::sync::atomic::Ordering::Relaxed)
}

/// Opens `path` for reading with O_DIRECT (the page cache is bypassed, so streaming measures the
/// disk). Where the filesystem refuses O_DIRECT (tmpfs), opens it buffered and says so;
/// returns the file and whether it is direct.
pub fn open_direct(path: &std::path::Path) -> io::Result<(std::fs::File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
            crate::log_warn!("O_DIRECT refused by the filesystem: reading through the page cache");
            Ok((std::fs::File::open(path)?, false))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_io_uring_the_lanes_read_with_pread() {
        let refused = || Err(io::Error::from_raw_os_error(nix::libc::ENOSYS));
        let b = choose_backend(refused(), 8);
        assert_eq!(b.name(), "pread");
        assert!(fell_back_to_pread());
        // Said once: the second fallback finds the flag already set.
        assert_eq!(choose_backend(refused(), 8).name(), "pread");
        if let Ok(u) = UringBackend::new(1, 4) {
            assert_eq!(choose_backend(Ok(u), 4).name(), "io_uring");
        }
    }

    #[test]
    fn pread_backend_reads_and_reports_errno() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 100]).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        let mut buf = [0u8; 64];
        let ptr = buf.as_mut_ptr();
        let mut b = PreadBackend::new(2);
        let sub = |tag, fd, offset| Submission {
            tag,
            lane: 0,
            fd,
            offset,
            len: 64,
            buf: ptr,
            buf_index: 0,
            block: 0,
            blocks: 1,
            block_stride: 0,
        };
        b.submit(sub(1, fd, 50)).unwrap();
        b.submit(sub(2, -1, 0)).unwrap();
        let mut out = [Completion { tag: 0, result: 0 }; 4];
        assert_eq!(b.reap(&mut out, true).unwrap(), 2);
        assert_eq!(out[0], Completion { tag: 1, result: 50 });
        assert_eq!(
            out[1],
            Completion {
                tag: 2,
                result: -nix::libc::EBADF
            }
        );
        assert_eq!(buf[..50], [7u8; 50]);
    }
}
