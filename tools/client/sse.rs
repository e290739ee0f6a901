//! Server-sent events: `data:` lines, events ended by an empty line.

use std::io::{self, BufRead, BufReader, Read};

/// Reads SSE events from a byte stream, however the bytes are split into reads.
pub struct SseReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
}

impl<R: Read> SseReader<R> {
    pub fn new(inner: R) -> Self {
        SseReader {
            inner: BufReader::new(inner),
            line: Vec::new(),
        }
    }

    /// The data of the next event (several `data:` lines joined by `\n`), or
    /// `None` at the end of the stream. Comments (`:`), `event:`, `id:` and
    /// `retry:` fields are skipped.
    pub fn next_data(&mut self) -> io::Result<Option<String>> {
        let mut data: Option<String> = None;
        loop {
            self.line.clear();
            let n = self.inner.read_until(b'\n', &mut self.line)?;
            if n == 0 {
                // End of stream: an unterminated event is still delivered.
                return Ok(data);
            }
            let mut l = &self.line[..];
            while let [rest @ .., b'\n' | b'\r'] = l {
                l = rest;
            }
            if l.is_empty() {
                if data.is_some() {
                    return Ok(data);
                }
                continue;
            }
            if let Some(v) = l.strip_prefix(b"data:") {
                let v = v.strip_prefix(b" ").unwrap_or(v);
                let v = std::str::from_utf8(v).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "event is not UTF-8")
                })?;
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(v);
                    }
                    None => data = Some(v.to_owned()),
                }
            }
        }
    }
}
