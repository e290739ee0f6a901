//! HTTP/1.1 request heads, routing, and responses, over byte buffers.
//!
//! Statuses for bad requests (each an [`HttpError`], answered with an OpenAI-shaped JSON error
//! body by `api::write_error_response`):
//!
//! | condition                                                   | status |
//! |-------------------------------------------------------------|--------|
//! | malformed request line or header, non-UTF-8 path            | 400    |
//! | bad `Content-Length` (not digits, several that disagree), or both `Content-Length` and `Transfer-Encoding` | 400 |
//! | more than [`MAX_HEADERS`] headers, or the buffer limit reached without a complete head | 431 |
//! | POST without `Content-Length`; any `Transfer-Encoding` (chunked bodies are not supported) | 411 |
//! | `Content-Length` more than the limit minus the head          | 413    |
//! | a version other than HTTP/1.0 or HTTP/1.1 (`HTTP/2.0`)        | 505    |
//! | unknown path (after [`route`])                              | 404    |
//! | known path, wrong method (after [`route`]; with `Allow`)    | 405    |
//!
//! Every response says `Connection: close`: one request per connection. `Head::keep_alive`
//! reports what the client asked for, for the server to use if that ever changes.

use super::FixedBuf;
use embedded_io::Write;

/// Headers parsed per request; more is a 431.
pub const MAX_HEADERS: usize = 32;

/// `Retry-After` seconds sent with a 503.
pub const RETRY_AFTER_SECS: u32 = 1;

/// A request method this server tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    /// Any other token (`HEAD`, `PUT`, ...): a 405 on known paths.
    Other,
}

/// A complete, accepted request head. It holds no borrow of the buffer, so the server may keep
/// reading into the buffer while it holds the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub method: Method,
    /// Byte offset and length of the request target (path and query) in the buffer.
    pub path_start: usize,
    pub path_len: usize,
    /// Bytes of the head, through the blank line; the body starts here.
    pub head_len: usize,
    /// The `Content-Length`; `None` when absent (only possible for a GET and other non-POSTs).
    pub content_length: Option<usize>,
    /// A `Transfer-Encoding` was given. Never true in an accepted head (those are 411s); kept
    /// so the field exists if chunked bodies are ever supported.
    pub chunked: bool,
    /// `Expect: 100-continue`: write [`write_continue`] before reading the body.
    pub expect_continue: bool,
    /// The client wants the connection kept (HTTP/1.1 without `Connection: close`, HTTP/1.0
    /// with `Connection: keep-alive`). The server closes anyway.
    pub keep_alive: bool,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
}

impl Head {
    /// The request target: it was checked to be UTF-8 (an empty string if `buf` is not the
    /// buffer the head was parsed from).
    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b str {
        buf.get(self.path_start..self.path_start + self.path_len)
            .and_then(|p| core::str::from_utf8(p).ok())
            .unwrap_or("")
    }

    /// Bytes of head plus body: once this many are buffered, the request is complete.
    pub fn total_len(&self) -> usize {
        self.head_len + self.content_length.unwrap_or(0)
    }
}

/// Why a request head was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpError {
    /// 400: the request line or a header is malformed.
    BadRequest(&'static str),
    /// 431: too many headers, or no complete head within the request size limit.
    HeadersTooLarge,
    /// 411: a POST without `Content-Length`, or a `Transfer-Encoding` body.
    LengthRequired,
    /// 413: the body does not fit the request size limit.
    PayloadTooLarge,
    /// 505: not HTTP/1.0 or HTTP/1.1.
    VersionNotSupported,
}

impl HttpError {
    pub fn status(self) -> u16 {
        match self {
            HttpError::BadRequest(_) => 400,
            HttpError::HeadersTooLarge => 431,
            HttpError::LengthRequired => 411,
            HttpError::PayloadTooLarge => 413,
            HttpError::VersionNotSupported => 505,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            HttpError::BadRequest(m) => m,
            HttpError::HeadersTooLarge => "request headers too large",
            HttpError::LengthRequired => {
                "a request body needs Content-Length (chunked transfer encoding is not supported)"
            }
            HttpError::PayloadTooLarge => "request body too large",
            HttpError::VersionNotSupported => "only HTTP/1.0 and HTTP/1.1 are supported",
        }
    }
}

/// [`parse_head_limited`] with the board's request size limit (`board::MAX_REQUEST_BYTES`).
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, HttpError> {
    parse_head_limited(buf, crate::board::MAX_REQUEST_BYTES)
}

/// Parses the request head at the start of `buf` (the bytes read so far; a body may follow).
/// `Ok(None)`: incomplete, read more. A head incomplete when `buf` already holds `limit` bytes
/// is a 431. A body of more than `limit - head_len` bytes is a 413.
pub fn parse_head_limited(buf: &[u8], limit: usize) -> Result<Option<Head>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= limit {
                Err(HttpError::HeadersTooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadersTooLarge),
        Err(httparse::Error::Version) => return Err(version_error(buf)),
        Err(httparse::Error::Token) => return Err(HttpError::BadRequest("malformed request line")),
        Err(_) => return Err(HttpError::BadRequest("malformed request head")),
    };
    if head_len > limit {
        return Err(HttpError::HeadersTooLarge);
    }
    let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HttpError::BadRequest("malformed request line"));
    };
    let method = match method {
        "GET" => Method::Get,
        "POST" => Method::Post,
        _ => Method::Other,
    };
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut expect_continue = false;
    let mut conn_close = false;
    let mut conn_keep = false;
    for h in req.headers.iter() {
        let value = trim(h.value);
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(value)?;
            if content_length.is_some_and(|m| m != n) {
                return Err(HttpError::BadRequest("conflicting Content-Length headers"));
            }
            content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        } else if h.name.eq_ignore_ascii_case("expect") {
            if value.eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',') {
                let token = trim(token);
                conn_close |= token.eq_ignore_ascii_case(b"close");
                conn_keep |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }
    if chunked {
        if content_length.is_some() {
            return Err(HttpError::BadRequest(
                "both Content-Length and Transfer-Encoding given",
            ));
        }
        return Err(HttpError::LengthRequired);
    }
    if method == Method::Post && content_length.is_none() {
        return Err(HttpError::LengthRequired);
    }
    if content_length.is_some_and(|n| n > limit - head_len) {
        return Err(HttpError::PayloadTooLarge);
    }
    let path_start = path.as_ptr() as usize - buf.as_ptr() as usize;
    Ok(Some(Head {
        method,
        path_start,
        path_len: path.len(),
        head_len,
        content_length,
        chunked,
        expect_continue,
        keep_alive: if minor == 1 { !conn_close } else { conn_keep },
        minor_version: minor,
    }))
}

/// httparse says "invalid HTTP version" for any bad third token of the request line; a
/// well-formed `HTTP/d.d` is an unsupported version (505), anything else a bad request (400).
fn version_error(buf: &[u8]) -> HttpError {
    let line_end = buf
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(buf.len());
    let line = &buf[..line_end];
    let mut parts = line.split(|&b| b == b' ');
    let (Some(_), Some(_), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return HttpError::BadRequest("malformed request line");
    };
    match version {
        [b'H', b'T', b'T', b'P', b'/', a, b'.', b] if a.is_ascii_digit() && b.is_ascii_digit() => {
            HttpError::VersionNotSupported
        }
        [b'H', b'T', b'T', b'P', b'/', a] if a.is_ascii_digit() => HttpError::VersionNotSupported,
        _ => HttpError::BadRequest("malformed request line"),
    }
}

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// `Content-Length`: 1*DIGIT. Too many digits for a usize is a 413 (it is too large anyway).
fn parse_length(v: &[u8]) -> Result<usize, HttpError> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return Err(HttpError::BadRequest("invalid Content-Length"));
    }
    let mut n: usize = 0;
    for &d in v {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add((d - b'0') as usize))
            .ok_or(HttpError::PayloadTooLarge)?;
    }
    Ok(n)
}

/// What a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `GET /v1/models`
    Models,
    /// `GET /health`
    Health,
    /// `GET /metrics`
    Metrics,
    /// 404.
    NotFound,
    /// 405: a known path with another method; the value of the `Allow` header.
    MethodNotAllowed(&'static str),
}

/// Routes a request. The query string is ignored; an absolute-form target
/// (`http://host/v1/models`) is reduced to its path.
pub fn route(method: Method, target: &str) -> Route {
    let mut path = target;
    for scheme in ["http://", "https://"] {
        if let Some(rest) = path.strip_prefix(scheme) {
            path = rest.find('/').map_or("/", |i| &rest[i..]);
        }
    }
    let path = path.split(['?', '#']).next().unwrap_or("");
    let (want, route) = match path {
        "/v1/completions" => (Method::Post, Route::Completions),
        "/v1/chat/completions" => (Method::Post, Route::ChatCompletions),
        "/v1/models" => (Method::Get, Route::Models),
        "/health" => (Method::Get, Route::Health),
        "/metrics" => (Method::Get, Route::Metrics),
        _ => return Route::NotFound,
    };
    if method == want {
        route
    } else {
        Route::MethodNotAllowed(if want == Method::Post { "POST" } else { "GET" })
    }
}

/// The reason phrase of a status this server sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// `Content-Type` of JSON bodies.
pub const JSON: &str = "application/json";
/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A response's status line and headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHead<'h> {
    pub status: u16,
    pub content_type: &'h str,
    /// `None` for a stream ended by closing the connection.
    pub content_length: Option<usize>,
    /// `Allow` (for a 405).
    pub allow: Option<&'static str>,
    /// `Retry-After` seconds (for a 503).
    pub retry_after: Option<u32>,
}

/// Writes the status line and headers, through the blank line, in one `write_all`.
pub fn write_head<W: Write>(w: &mut W, head: &ResponseHead) -> Result<(), W::Error> {
    let mut bytes = [0u8; 512];
    let mut b = FixedBuf::new(&mut bytes);
    let t: &mut dyn core::fmt::Write = &mut b;
    // 512 bytes hold every head this server writes (content types are the consts above).
    let _ = write!(
        t,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\n",
        head.status,
        reason(head.status),
        head.content_type
    );
    if let Some(n) = head.content_length {
        let _ = write!(t, "Content-Length: {n}\r\n");
    } else {
        let _ = t.write_str("Cache-Control: no-cache\r\n");
    }
    if let Some(a) = head.allow {
        let _ = write!(t, "Allow: {a}\r\n");
    }
    if let Some(s) = head.retry_after {
        let _ = write!(t, "Retry-After: {s}\r\n");
    }
    let _ = t.write_str("Connection: close\r\n\r\n");
    debug_assert!(!b.overflowed());
    w.write_all(b.as_bytes())
}

/// A complete response with a body.
pub fn write_response<W: Write>(
    w: &mut W,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> Result<(), W::Error> {
    write_head(
        w,
        &ResponseHead {
            status,
            content_type,
            content_length: Some(body.len()),
            allow: None,
            retry_after: (status == 503).then_some(RETRY_AFTER_SECS),
        },
    )?;
    w.write_all(body)
}

/// A complete JSON response (a 503 gets `Retry-After`).
pub fn write_json<W: Write>(w: &mut W, status: u16, body: &[u8]) -> Result<(), W::Error> {
    write_response(w, status, JSON, body)
}

/// An error response whose JSON body is already rendered (`api::write_error_response` renders
/// OpenAI's error shape): `Allow` for a 405 and `Retry-After` for a 503.
pub fn write_error_body<W: Write>(
    w: &mut W,
    status: u16,
    allow: Option<&'static str>,
    body: &[u8],
) -> Result<(), W::Error> {
    write_head(
        w,
        &ResponseHead {
            status,
            content_type: JSON,
            content_length: Some(body.len()),
            allow,
            retry_after: (status == 503).then_some(RETRY_AFTER_SECS),
        },
    )?;
    w.write_all(body)
}

/// `100 Continue`, for a head with `expect_continue`, before reading its body.
pub fn write_continue<W: Write>(w: &mut W) -> Result<(), W::Error> {
    w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
}

/// The head of a server-sent-events stream: 200, `text/event-stream`, no `Content-Length` (the
/// stream ends when the connection closes).
pub fn write_sse_head<W: Write>(w: &mut W) -> Result<(), W::Error> {
    write_head(
        w,
        &ResponseHead {
            status: 200,
            content_type: "text/event-stream",
            content_length: None,
            allow: None,
            retry_after: None,
        },
    )
}

/// One event: `data: {json}\n\n`. `json` must be one line (the writers in `api` never write a
/// raw newline: newlines in text are escaped).
pub fn write_sse_event<W: Write>(w: &mut W, json: &[u8]) -> Result<(), W::Error> {
    w.write_all(b"data: ")?;
    w.write_all(json)?;
    w.write_all(b"\n\n")
}

/// The last event of a stream: `data: [DONE]\n\n`.
pub fn write_sse_done<W: Write>(w: &mut W) -> Result<(), W::Error> {
    w.write_all(b"data: [DONE]\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::api::ApiError;
    use crate::serve::json;

    const LIMIT: usize = 1024;

    fn parse(s: &[u8]) -> Result<Option<Head>, HttpError> {
        parse_head_limited(s, LIMIT)
    }

    fn ok(s: &[u8]) -> Head {
        parse(s).unwrap().unwrap()
    }

    const POST: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n\
        Content-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"prompt\":\"hi\"}";

    #[test]
    fn parses_a_post() {
        let h = ok(POST);
        assert_eq!(h.method, Method::Post);
        assert_eq!(h.path(POST), "/v1/completions");
        assert_eq!(h.content_length, Some(17));
        assert_eq!(&POST[h.head_len..], b"{\"prompt\":\"hi\"}");
        assert_eq!(h.total_len(), POST.len() + 2);
        assert!(h.keep_alive && !h.expect_continue && !h.chunked);
        assert_eq!(h.minor_version, 1);
    }

    #[test]
    fn partial_heads_need_more_at_every_split() {
        let head_len = ok(POST).head_len;
        for i in 0..head_len {
            assert_eq!(parse(&POST[..i]), Ok(None), "split at {i}");
        }
        for i in head_len..=POST.len() {
            assert_eq!(ok(&POST[..i]).head_len, head_len);
        }
    }

    #[test]
    fn get_http10_and_connection_headers() {
        let h = ok(b"GET /health HTTP/1.0\r\n\r\n");
        assert_eq!(
            (h.method, h.minor_version, h.keep_alive),
            (Method::Get, 0, false)
        );
        assert_eq!(h.content_length, None);
        let h = ok(b"GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(h.keep_alive);
        let h = ok(b"GET /health HTTP/1.1\r\nconnection: foo, close\r\n\r\n");
        assert!(!h.keep_alive);
        let h = ok(b"PUT /x HTTP/1.1\r\n\r\n");
        assert_eq!(h.method, Method::Other);
    }

    #[test]
    fn expect_continue() {
        let h = ok(
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-Continue\r\n\r\n",
        );
        assert!(h.expect_continue);
        let mut b = [0u8; 64];
        let mut f = FixedBuf::new(&mut b);
        write_continue(&mut f).unwrap();
        assert_eq!(f.as_bytes(), b"HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn error_statuses() {
        let cases: &[(&[u8], u16)] = &[
            (b"GET\r\n\r\n", 400),
            (b"GET /a b HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
            (b"GET /\xff\xfe HTTP/1.1\r\n\r\n", 400),
            (b"GET / FOO/1.1\r\n\r\n", 400),
            (b"GET / HTTP/2.0\r\n\r\n", 505),
            (b"GET / HTTP/1.2\r\n\r\n", 505),
            (b"GET / HTTP/3\r\n\r\n", 505),
            (b"POST /v1/completions HTTP/1.1\r\n\r\n", 411),
            (
                b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                411,
            ),
            (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                400,
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: 3x\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 400),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                400,
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                413,
            ),
        ];
        for (req, status) in cases {
            let got = parse(req).map(|_| ()).unwrap_err().status();
            assert_eq!(got, *status, "{}", String::from_utf8_lossy(req));
        }
        // The same Content-Length twice is fine.
        let h = ok(b"POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(h.content_length, Some(3));
    }

    #[test]
    fn too_many_or_too_large_headers_are_431() {
        let mut req = std::string::String::from("GET / HTTP/1.1\r\n");
        for i in 0..MAX_HEADERS + 1 {
            req.push_str(&format!("X-{i}: y\r\n"));
        }
        req.push_str("\r\n");
        assert_eq!(
            parse_head_limited(req.as_bytes(), 4096),
            Err(HttpError::HeadersTooLarge)
        );
        // A head still incomplete when the buffer holds the limit.
        let mut big = std::vec::Vec::from(&b"GET / HTTP/1.1\r\nX-Long: "[..]);
        big.resize(LIMIT - 1, b'a');
        assert_eq!(parse(&big), Ok(None));
        big.push(b'a');
        assert_eq!(parse(&big), Err(HttpError::HeadersTooLarge));
    }

    #[test]
    fn body_at_the_limit_and_one_over() {
        let head =
            |n: usize| format!("POST /v1/completions HTTP/1.1\r\nContent-Length: {n:04}\r\n\r\n");
        let head_len = head(0).len();
        let max = LIMIT - head_len;
        assert_eq!(ok(head(max).as_bytes()).content_length, Some(max));
        assert_eq!(
            parse(head(max + 1).as_bytes()),
            Err(HttpError::PayloadTooLarge)
        );
        // The board's limit.
        let board = crate::board::MAX_REQUEST_BYTES;
        let h = format!(
            "POST /v1/completions HTTP/1.1\r\nContent-Length: {:08}\r\n\r\n",
            0
        );
        let max = board - h.len();
        let at = format!("POST /v1/completions HTTP/1.1\r\nContent-Length: {max:08}\r\n\r\n");
        assert_eq!(
            parse_head(at.as_bytes()).unwrap().unwrap().content_length,
            Some(max)
        );
        let over = format!(
            "POST /v1/completions HTTP/1.1\r\nContent-Length: {:08}\r\n\r\n",
            max + 1
        );
        assert_eq!(parse_head(over.as_bytes()), Err(HttpError::PayloadTooLarge));
    }

    #[test]
    fn routes() {
        use Method::*;
        assert_eq!(route(Post, "/v1/completions"), Route::Completions);
        assert_eq!(route(Post, "/v1/chat/completions"), Route::ChatCompletions);
        assert_eq!(route(Get, "/v1/models"), Route::Models);
        assert_eq!(route(Get, "/health"), Route::Health);
        assert_eq!(route(Get, "/metrics"), Route::Metrics);
        assert_eq!(route(Get, "/metrics?x=1"), Route::Metrics);
        assert_eq!(
            route(Post, "/v1/completions?api-version=1"),
            Route::Completions
        );
        assert_eq!(route(Get, "http://localhost/v1/models"), Route::Models);
        assert_eq!(route(Get, "http://localhost"), Route::NotFound);
        assert_eq!(
            route(Get, "/v1/completions"),
            Route::MethodNotAllowed("POST")
        );
        assert_eq!(
            route(Other, "/v1/chat/completions"),
            Route::MethodNotAllowed("POST")
        );
        assert_eq!(route(Post, "/v1/models"), Route::MethodNotAllowed("GET"));
        assert_eq!(route(Post, "/health"), Route::MethodNotAllowed("GET"));
        assert_eq!(route(Other, "/metrics"), Route::MethodNotAllowed("GET"));
        assert_eq!(route(Get, "/"), Route::NotFound);
        assert_eq!(route(Post, "/v1/completions/"), Route::NotFound);
        assert_eq!(route(Get, "/v1/models/x"), Route::NotFound);
        assert_eq!(route(Get, "*"), Route::NotFound);
    }

    fn written(
        f: impl FnOnce(&mut FixedBuf) -> Result<(), crate::serve::Overflow>,
    ) -> std::string::String {
        let mut b = [0u8; 4096];
        let mut w = FixedBuf::new(&mut b);
        f(&mut w).unwrap();
        w.as_str().into()
    }

    /// Splits a response into head and body, checking Content-Length when present.
    fn split(resp: &str) -> (&str, &str) {
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        if let Some(l) = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
        {
            assert_eq!(l.parse::<usize>().unwrap(), body.len());
        }
        (head, body)
    }

    #[test]
    fn json_response() {
        let r = written(|w| write_json(w, 200, b"{\"a\":1}"));
        let (head, body) = split(&r);
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\nConnection: close"
        );
        assert_eq!(body, "{\"a\":1}");
    }

    fn error_response(e: ApiError) -> std::string::String {
        let mut scratch = [0u8; crate::serve::api::ERROR_BODY_MAX];
        written(|w| crate::serve::api::write_error_response(w, &e, &mut scratch))
    }

    #[test]
    fn error_responses() {
        let r = error_response(ApiError::method_not_allowed("POST"));
        let (head, body) = split(&r);
        assert!(head.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(head.contains("\r\nAllow: POST\r\n"));
        assert!(!head.contains("Retry-After"));
        json::validate(body.as_bytes()).unwrap();
        assert!(body.contains("\"type\":\"invalid_request_error\""));

        let r = error_response(ApiError::queue_full());
        let (head, body) = split(&r);
        assert!(head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(head.contains("\r\nRetry-After: 1\r\n"));
        assert!(body.contains("\"type\":\"server_error\""));
        assert!(body.contains("queue"));
        json::validate(body.as_bytes()).unwrap();

        for e in [
            HttpError::BadRequest("malformed request line"),
            HttpError::HeadersTooLarge,
            HttpError::LengthRequired,
            HttpError::PayloadTooLarge,
            HttpError::VersionNotSupported,
        ] {
            let r = error_response(e.into());
            let (head, body) = split(&r);
            assert!(head.starts_with(&format!(
                "HTTP/1.1 {} {}\r\n",
                e.status(),
                reason(e.status())
            )));
            json::validate(body.as_bytes()).unwrap();
            assert!(body.starts_with("{\"error\":{\"message\":"), "{body}");
        }
        let r = error_response(ApiError::not_found());
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"));
    }

    #[test]
    fn sse_stream() {
        let r = written(|w| {
            write_sse_head(w)?;
            write_sse_event(w, b"{\"a\":1}")?;
            write_sse_done(w)
        });
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("Content-Type: text/event-stream\r\n"));
        assert!(!head.contains("Content-Length"));
        assert!(head.contains("Connection: close"));
        assert_eq!(body, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    }
}
