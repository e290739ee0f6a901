//! Refusals the acceptor answers itself (403 to a peer off the allowlist, 503 when every slot
//! is busy) without ever blocking: the short error is written to the fresh socket without
//! waiting, and the connection is kept in a small fixed list where the acceptor reads and
//! discards what the client still sends for a moment before closing (closing a Unix socket with
//! unread bytes makes the peer's read fail with ECONNRESET before it sees the answer). Their log
//! lines are rate-limited.

use super::api::{self, ApiError};
use super::FixedBuf;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Refused connections read-and-discarded at once; past this the oldest is closed.
const LINGERING: usize = 32;
/// How long a refused connection is read from before it is closed.
pub const LINGER: Duration = Duration::from_millis(200);

/// At most one log line per `every`; the lines left out are counted and reported with the next.
pub struct RateLimit {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    pub const fn new(every: Duration) -> Self {
        RateLimit {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: log now, mentioning the `n` lines suppressed since the last one; `None`: skip.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(core::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Connections the acceptor refused, draining until their deadline.
pub struct Lingering {
    conns: heapless::Deque<(UnixStream, Instant), LINGERING>,
}

impl Default for Lingering {
    fn default() -> Self {
        Self::new()
    }
}

impl Lingering {
    pub fn new() -> Self {
        Lingering {
            conns: heapless::Deque::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Answers `e` without waiting (a fresh socket's send buffer takes the few hundred bytes),
    /// ends our side, and keeps the connection to drain.
    pub fn refuse(&mut self, stream: UnixStream, e: &ApiError, now: Instant) {
        let _ = stream.set_nonblocking(true);
        let mut bytes = [0u8; 512 + api::ERROR_BODY_MAX];
        let mut scratch = [0u8; api::ERROR_BODY_MAX];
        let mut out = FixedBuf::new(&mut bytes);
        let _ = api::write_error_response(&mut out, e, &mut scratch);
        let _ = (&stream).write(out.as_bytes());
        let _ = stream.shutdown(std::net::Shutdown::Write);
        if self.conns.is_full() {
            drop(self.conns.pop_front());
        }
        let _ = self.conns.push_back((stream, now + LINGER));
    }

    /// Reads what each refused client sent since; closes those that finished or timed out.
    pub fn service(&mut self, now: Instant) {
        let mut sink = [0u8; 512];
        for _ in 0..self.conns.len() {
            let Some((mut s, until)) = self.conns.pop_front() else {
                break;
            };
            let keep = now < until
                && loop {
                    match s.read(&mut sink) {
                        Ok(0) => break false,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break false,
                    }
                };
            if keep {
                let _ = self.conns.push_back((s, until));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_second_with_the_count_left_out() {
        let mut r = RateLimit::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(r.admit(t0), Some(0));
        for i in 1..=49 {
            assert_eq!(r.admit(t0 + Duration::from_millis(i * 10)), None);
        }
        assert_eq!(r.admit(t0 + Duration::from_millis(1000)), Some(49));
        assert_eq!(r.admit(t0 + Duration::from_millis(1500)), None);
        assert_eq!(r.admit(t0 + Duration::from_millis(2100)), Some(1));
        assert_eq!(r.admit(t0 + Duration::from_millis(5000)), Some(0));
    }

    #[test]
    fn a_refusal_is_answered_at_once_and_drained_without_blocking() {
        let mut l = Lingering::new();
        let now = Instant::now();
        let mut clients = Vec::new();
        for _ in 0..LINGERING + 3 {
            let (server, client) = UnixStream::pair().unwrap();
            l.refuse(server, &ApiError::queue_full(), now);
            clients.push(client);
        }
        // The oldest were closed to keep the list fixed.
        assert_eq!(l.len(), LINGERING);
        let mut c = clients.pop().unwrap();
        c.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
        let t = Instant::now();
        l.service(now);
        assert!(t.elapsed() < Duration::from_millis(100));
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
        assert!(got.contains("Retry-After: 1\r\n"), "{got}");
        // Client done: after its close the connection is dropped; past the deadline all are.
        drop(c);
        l.service(now);
        assert_eq!(l.len(), LINGERING - 1);
        l.service(now + LINGER);
        assert!(l.is_empty());
    }
}
