//! The protocol layer of `leanstreamd`: OpenAI-compatible HTTP/1.1 as pure functions over byte
//! buffers. Nothing here allocates on the heap or does I/O except through the writer given to it.
//!
//! - [`http`]: the request head (`httparse` into a fixed header array), routing, status lines,
//!   JSON responses and server-sent events, written to any `embedded_io::Write`.
//! - [`api`]: the OpenAI request subset (`/v1/completions`, `/v1/chat/completions`) parsed into
//!   borrowed views of a caller-given text buffer, OpenAI-shaped errors, and the response writers.
//! - [`json`]: the allocation-free JSON reader/escaper both use, and [`json::Utf8Carry`].
//! - [`metrics`]: lock-free counters and their Prometheus text.
//!
//! The flow the server follows for one connection (all buffers fixed, sized from the board):
//!
//! 1. Read into the request buffer (`board::MAX_REQUEST_BYTES`) until [`http::parse_head`]
//!    returns `Some(head)`; on `Err(e)` answer `e.status()` via [`api::write_error_response`].
//! 2. `http::route(head.method, head.path(buf))`; if `head.expect_continue`, write
//!    [`http::write_continue`]; read until `head.head_len + head.content_length` bytes are in.
//! 3. `api::parse_completion(body, text)` / `api::parse_chat(body, text)` with a text buffer at
//!    least as long as the body (the unescaped strings never need more).
//! 4. Answer with the `api::write_*` JSON writers into a [`FixedBuf`], then
//!    [`http::write_json`], or stream with [`http::write_sse_head`], [`http::write_sse_event`]
//!    and [`http::write_sse_done`].

pub mod alloc_count;
pub mod api;
pub mod http;
mod job;
pub mod json;
pub mod metrics;
pub mod outbox;
pub mod refusal;
pub mod server;

use core::fmt;

/// A zeroed buffer whose pages are all resident now (a fresh allocation of zeros is only
/// backed by memory as it is first written, which would make the daemon grow while serving).
pub(super) fn resident<T: Copy + Default>(n: usize) -> Box<[T]> {
    let mut b = vec![T::default(); n].into_boxed_slice();
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for i in (0..n).step_by(step) {
        // SAFETY: `i < n`, in bounds of the buffer we own; volatile so it is not elided.
        unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(i), T::default()) };
    }
    b
}

/// A fixed byte buffer written from the front, for `core::fmt::Write` (the JSON writers) and
/// `embedded_io::Write` (the HTTP writers, in tests). Writing past the end fails and marks it
/// overflowed; what was written before stays.
pub struct FixedBuf<'b> {
    buf: &'b mut [u8],
    len: usize,
    overflow: bool,
}

impl<'b> FixedBuf<'b> {
    pub fn new(buf: &'b mut [u8]) -> Self {
        FixedBuf {
            buf,
            len: 0,
            overflow: false,
        }
    }

    /// The bytes written.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The bytes written, as text (always UTF-8 when only `fmt::Write` wrote them).
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a write did not fit.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Empties it, for the next message.
    pub fn clear(&mut self) {
        self.len = 0;
        self.overflow = false;
    }

    fn put(&mut self, bytes: &[u8]) -> bool {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(dst) if !self.overflow => {
                dst.copy_from_slice(bytes);
                self.len += bytes.len();
                true
            }
            _ => {
                self.overflow = true;
                false
            }
        }
    }
}

impl fmt::Write for FixedBuf<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.put(s.as_bytes()) {
            Ok(())
        } else {
            Err(fmt::Error)
        }
    }
}

/// The error of writing past the end of a [`FixedBuf`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow;

impl embedded_io::Error for Overflow {
    fn kind(&self) -> embedded_io::ErrorKind {
        embedded_io::ErrorKind::OutOfMemory
    }
}

impl embedded_io::ErrorType for FixedBuf<'_> {
    type Error = Overflow;
}

impl embedded_io::Write for FixedBuf<'_> {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Overflow> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.put(buf) {
            Ok(buf.len())
        } else {
            Err(Overflow)
        }
    }

    fn flush(&mut self) -> Result<(), Overflow> {
        Ok(())
    }
}

/// Adapts a `std::io::Write` (a `UnixStream`) to `embedded_io::Write`, the trait between the
/// layers. Errors are the `std::io::Error`s themselves.
pub struct StdWriter<T>(pub T);

impl<T: std::io::Write> embedded_io::ErrorType for StdWriter<T> {
    type Error = std::io::Error;
}

impl<T: std::io::Write> embedded_io::Write for StdWriter<T> {
    fn write(&mut self, buf: &[u8]) -> Result<usize, std::io::Error> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> Result<(), std::io::Error> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write as _;
    use embedded_io::Write as _;

    #[test]
    fn fixed_buf_overflow() {
        let mut b = [0u8; 4];
        let mut f = FixedBuf::new(&mut b);
        f.write_str("ab").unwrap();
        assert!(f.write_str("cde").is_err());
        assert!(f.overflowed());
        assert_eq!(f.as_str(), "ab");
        // Once overflowed, later writes that would fit still fail: the text has a hole.
        assert!(f.write_str("c").is_err());
        f.clear();
        f.write_all(b"abcd").unwrap();
        assert_eq!(f.as_bytes(), b"abcd");
    }

    #[test]
    fn std_writer() {
        let mut v = std::vec::Vec::new();
        StdWriter(&mut v).write_all(b"hi").unwrap();
        assert_eq!(v, b"hi");
    }
}
