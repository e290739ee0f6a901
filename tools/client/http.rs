//! Just enough HTTP/1.1 for one request per connection: a request writer and
//! a response reader handling `Content-Length`, `Transfer-Encoding: chunked`
//! and read-until-close bodies.

use std::io::{self, BufRead, BufReader, Read, Write};

use super::ClientError;

/// Longest response head accepted (status line plus headers).
const MAX_HEAD: usize = 64 * 1024;

/// Writes a request with `Connection: close` (and a JSON body if given).
pub fn write_request(
    w: &mut dyn Write,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<()> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: leanstream/{}\r\nConnection: close\r\n",
        env!("CARGO_PKG_VERSION")
    );
    match body {
        Some(b) => {
            head.push_str(
                "Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n",
            );
            head.push_str(&format!("Content-Length: {}\r\n\r\n", b.len()));
            head.push_str(b);
        }
        None => head.push_str("\r\n"),
    }
    w.write_all(head.as_bytes())?;
    w.flush()
}

/// A response whose head has been read; the body is still on the wire.
pub struct Response<R> {
    pub status: u16,
    pub reason: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    reader: BufReader<R>,
}

impl<R: Read> Response<R> {
    /// The value of the first header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as a reader, de-chunked and limited to `Content-Length`.
    pub fn into_body(self) -> Body<R> {
        let chunked = self
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            return Body::Chunked {
                inner: self.reader,
                left: 0,
                done: false,
            };
        }
        match self
            .header("content-length")
            .and_then(|v| v.trim().parse().ok())
        {
            Some(n) => Body::Length(self.reader.take(n)),
            None => Body::Close(self.reader),
        }
    }

    /// Reads the whole body as (lossy) UTF-8.
    pub fn read_body_to_string(self) -> io::Result<String> {
        let mut bytes = Vec::new();
        self.into_body().read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Turns an error response into [`ClientError::Server`] with the message
    /// of `{"error":{"message":...}}`, or the body text if it is not that.
    pub fn into_error(self) -> ClientError {
        let status = self.status;
        let reason = self.reason.clone();
        let body = self.read_body_to_string().unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").map(super::error_message))
            .unwrap_or_else(|| {
                let t = body.trim();
                if t.is_empty() {
                    reason
                } else {
                    t.chars().take(500).collect()
                }
            });
        ClientError::Server { status, message }
    }
}

/// Reads the status line and headers.
pub fn read_response<R: Read>(inner: R) -> Result<Response<R>, ClientError> {
    let mut reader = BufReader::new(inner);
    let mut line = String::new();
    let mut head_len = 0usize;
    let mut read_line = |reader: &mut BufReader<R>, line: &mut String| -> Result<(), ClientError> {
        line.clear();
        let n = reader.read_line(line)?;
        head_len += n;
        if n == 0 {
            return Err(ClientError::Protocol(
                "connection closed before the response head ended".into(),
            ));
        }
        if head_len > MAX_HEAD {
            return Err(ClientError::Protocol("response head too long".into()));
        }
        Ok(())
    };
    read_line(&mut reader, &mut line)?;
    let status_line = line.trim_end().to_owned();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let status = parts.next().and_then(|s| s.parse::<u16>().ok());
    let (true, Some(status)) = (version.starts_with("HTTP/1."), status) else {
        return Err(ClientError::Protocol(format!(
            "bad status line {status_line:?}"
        )));
    };
    let reason = parts.next().unwrap_or("").to_owned();
    let mut headers = Vec::new();
    loop {
        read_line(&mut reader, &mut line)?;
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            return Err(ClientError::Protocol(format!("bad header line {l:?}")));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Response {
        status,
        reason,
        headers,
        reader,
    })
}

/// A response body.
pub enum Body<R> {
    Length(io::Take<BufReader<R>>),
    Chunked {
        inner: BufReader<R>,
        /// Bytes left in the current chunk.
        left: u64,
        done: bool,
    },
    Close(BufReader<R>),
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

impl<R: Read> Read for Body<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Body::Length(r) => r.read(buf),
            Body::Close(r) => r.read(buf),
            Body::Chunked { inner, left, done } => {
                if *done || buf.is_empty() {
                    return Ok(0);
                }
                if *left == 0 {
                    let mut line = String::new();
                    if inner.read_line(&mut line)? == 0 {
                        return Err(bad("chunked body ended without the last chunk"));
                    }
                    let size = line.trim_end().split(';').next().unwrap_or("").trim();
                    let size = u64::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
                    if size == 0 {
                        // Trailers, up to the empty line.
                        loop {
                            line.clear();
                            if inner.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                                break;
                            }
                        }
                        *done = true;
                        return Ok(0);
                    }
                    *left = size;
                }
                let want = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                let n = inner.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(bad("chunked body ended inside a chunk"));
                }
                *left -= n as u64;
                if *left == 0 {
                    let mut crlf = String::new();
                    inner.read_line(&mut crlf)?;
                }
                Ok(n)
            }
        }
    }
}
