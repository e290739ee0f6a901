//! A client slot's output buffer: a fixed byte ring between the engine thread (which writes the
//! response into it) and the slot's own thread (which sends it to the client's socket). The
//! engine never touches a socket, so a client that stops reading costs the engine at most a
//! short wait ([`Outbox::push`]'s limit) before its request is cancelled.
//!
//! The ring is made once at boot; nothing here allocates afterwards.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why [`Outbox::push`] could not deliver all its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// The slot stopped sending: the client went away.
    Closed,
    /// The ring stayed full past the limit: the client could not keep up.
    Full,
}

/// What [`Outbox::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// This many bytes were copied out (and freed in the ring).
    Bytes(usize),
    /// Nothing yet; the engine has not finished.
    Idle,
    /// The engine finished and everything was taken.
    Finished,
    /// The engine gave up on this client: send nothing more.
    Aborted,
}

struct Ring {
    buf: Box<[u8]>,
    start: usize,
    len: usize,
    /// The engine wrote its last byte for this request.
    finished: bool,
    /// The engine cut the client off (it could not keep up): the rest is not sent.
    aborted: bool,
    /// The slot stopped sending (the client went away); the engine should stop generating.
    closed: bool,
    /// The status the engine answered, for the slot to count once the bytes are out.
    status: u16,
    /// Time the engine spent waiting for room in this request.
    waited: Duration,
}

pub struct Outbox {
    ring: Mutex<Ring>,
    /// Signalled when bytes arrive or the engine finishes.
    data: Condvar,
    /// Signalled when bytes are taken out or the slot closes.
    room: Condvar,
}

impl Outbox {
    /// An outbox of `capacity` bytes (all resident now).
    pub fn new(capacity: usize) -> Outbox {
        Outbox {
            ring: Mutex::new(Ring {
                buf: super::resident(capacity.max(1)),
                start: 0,
                len: 0,
                finished: false,
                aborted: false,
                closed: false,
                status: 0,
                waited: Duration::ZERO,
            }),
            data: Condvar::new(),
            room: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties it for a new request (the slot, before queueing).
    pub fn reset(&self) {
        let mut r = self.lock();
        r.start = 0;
        r.len = 0;
        r.finished = false;
        r.aborted = false;
        r.closed = false;
        r.status = 0;
        r.waited = Duration::ZERO;
    }

    /// Engine side: appends `bytes`, waiting for room while the slot sends. Fails when the slot
    /// closed, or when one wait for room lasts past `limit` or all waits of this request past
    /// `budget` (the client cannot keep up).
    pub fn push(
        &self,
        mut bytes: &[u8],
        limit: Duration,
        budget: Duration,
    ) -> Result<(), PushError> {
        let mut r = self.lock();
        let mut wait_started: Option<Instant> = None;
        loop {
            if r.closed {
                return Err(PushError::Closed);
            }
            let cap = r.buf.len();
            let room = cap - r.len;
            let n = room.min(bytes.len());
            if n > 0 {
                let mut at = (r.start + r.len) % cap;
                let mut left = &bytes[..n];
                while !left.is_empty() {
                    let k = left.len().min(cap - at);
                    r.buf[at..at + k].copy_from_slice(&left[..k]);
                    left = &left[k..];
                    at = (at + k) % cap;
                }
                r.len += n;
                bytes = &bytes[n..];
                self.data.notify_one();
            }
            if bytes.is_empty() {
                if let Some(t) = wait_started {
                    r.waited += t.elapsed();
                }
                return Ok(());
            }
            let started = *wait_started.get_or_insert_with(Instant::now);
            let waited = started.elapsed();
            if waited >= limit || r.waited + waited >= budget {
                r.waited += waited;
                return Err(PushError::Full);
            }
            let left = (limit - waited).min(budget - (r.waited + waited));
            r = self
                .room
                .wait_timeout(r, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Engine side: the slot has closed (the client went away).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Slot side: the engine cut this client off (stop sending).
    pub fn is_aborted(&self) -> bool {
        self.lock().aborted
    }

    /// Engine side: the response is complete (or `abort`: cut off, send nothing more); `status`
    /// is counted by the slot once it knows whether the bytes got out.
    pub fn finish(&self, status: u16, abort: bool) {
        let mut r = self.lock();
        r.finished = true;
        r.aborted |= abort;
        r.status = status;
        self.data.notify_all();
    }

    /// Slot side: moves up to `out.len()` bytes out, waiting up to `wait` for some.
    pub fn take(&self, out: &mut [u8], wait: Duration) -> Take {
        let mut r = self.lock();
        if r.len == 0 && !r.finished {
            r = self
                .data
                .wait_timeout(r, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if r.aborted {
            return Take::Aborted;
        }
        if r.len == 0 {
            return if r.finished {
                Take::Finished
            } else {
                Take::Idle
            };
        }
        let cap = r.buf.len();
        let n = r.len.min(out.len());
        let first = n.min(cap - r.start);
        out[..first].copy_from_slice(&r.buf[r.start..r.start + first]);
        out[first..n].copy_from_slice(&r.buf[..n - first]);
        r.start = (r.start + n) % cap;
        r.len -= n;
        self.room.notify_one();
        Take::Bytes(n)
    }

    /// Slot side: the client is gone; the engine stops at its next push or token.
    pub fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }

    /// Slot side: waits until the engine is done with the request (it may still be queued or
    /// running after the slot closed); returns the status the engine answered.
    pub fn wait_finished(&self, tick: Duration) -> u16 {
        let mut r = self.lock();
        while !r.finished {
            r = self
                .data
                .wait_timeout(r, tick)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        r.status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn bytes_pass_in_order_through_a_small_ring() {
        let o = Outbox::new(7);
        let sent: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let mut got = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                for chunk in sent.chunks(13) {
                    o.push(chunk, LONG, LONG).unwrap();
                }
                o.finish(200, false);
            });
            let mut buf = [0u8; 5];
            loop {
                match o.take(&mut buf, Duration::from_millis(10)) {
                    Take::Bytes(n) => got.extend_from_slice(&buf[..n]),
                    Take::Idle => {}
                    Take::Finished => break,
                    Take::Aborted => panic!("not aborted"),
                }
            }
        });
        assert_eq!(got, sent);
        assert_eq!(o.wait_finished(Duration::from_millis(1)), 200);
    }

    #[test]
    fn a_full_ring_fails_after_the_limit_and_a_closed_one_at_once() {
        let o = Outbox::new(8);
        o.push(b"12345678", LONG, LONG).unwrap();
        let t = Instant::now();
        let limit = Duration::from_millis(50);
        assert_eq!(o.push(b"9", limit, LONG), Err(PushError::Full));
        assert!(t.elapsed() >= limit);
        // The budget over the whole request counts the wait above.
        let mut b = [0u8; 1];
        assert_eq!(o.take(&mut b, LONG), Take::Bytes(1));
        o.push(b"9", limit, LONG).unwrap();
        assert_eq!(
            o.push(b"x", LONG, Duration::from_millis(80)),
            Err(PushError::Full)
        );
        o.close();
        assert_eq!(o.push(b"x", LONG, LONG), Err(PushError::Closed));
        o.finish(499, true);
        assert!(o.is_aborted());
        assert_eq!(o.take(&mut b, LONG), Take::Aborted);
        o.reset();
        assert_eq!(o.take(&mut b, Duration::from_millis(1)), Take::Idle);
        o.push(b"a", LONG, LONG).unwrap();
        o.finish(200, false);
        assert_eq!(o.take(&mut b, LONG), Take::Bytes(1));
        assert_eq!(o.take(&mut b, LONG), Take::Finished);
    }

    #[test]
    fn a_waiting_push_completes_when_the_slot_takes() {
        let o = Outbox::new(4);
        o.push(b"abcd", LONG, LONG).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                let mut b = [0u8; 4];
                assert_eq!(o.take(&mut b, LONG), Take::Bytes(4));
            });
            o.push(b"efgh", LONG, LONG).unwrap();
        });
        let mut b = [0u8; 8];
        assert_eq!(o.take(&mut b, LONG), Take::Bytes(4));
        assert_eq!(&b[..4], b"efgh");
    }
}
