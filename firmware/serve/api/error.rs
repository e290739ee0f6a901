//! [`ApiError`], the error answered to a client, and its JSON in OpenAI's shape.

use crate::serve::http::{self, HttpError};
use crate::serve::json;
use crate::serve::FixedBuf;
use core::fmt::{self, Write};

/// An error answered to the client, in OpenAI's shape (see [`write_error`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    /// Truncated to 256 bytes (at a character boundary).
    pub message: heapless::String<256>,
    /// The request field at fault.
    pub param: Option<&'static str>,
    /// For a 405: the `Allow` header.
    pub allow: Option<&'static str>,
}

/// Writes into a heapless string, dropping what does not fit.
struct Truncating<'s>(&'s mut heapless::String<256>);

impl Write for Truncating<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.0.push(c).is_err() {
                break;
            }
        }
        Ok(())
    }
}

impl ApiError {
    pub fn new(status: u16, param: Option<&'static str>, message: fmt::Arguments) -> Self {
        let mut m = heapless::String::new();
        let _ = Truncating(&mut m).write_fmt(message);
        ApiError {
            status,
            message: m,
            param,
            allow: None,
        }
    }

    /// A 400 about field `param`.
    pub fn invalid(param: &'static str, message: fmt::Arguments) -> Self {
        Self::new(400, Some(param), message)
    }

    /// A 400 not about one field.
    pub fn bad_request(message: &str) -> Self {
        Self::new(400, None, format_args!("{message}"))
    }

    /// 404 for an unknown path.
    pub fn not_found() -> Self {
        Self::new(404, None, format_args!("unknown path"))
    }

    /// 405 for a known path with another method; `allow` is the method it takes.
    pub fn method_not_allowed(allow: &'static str) -> Self {
        let mut e = Self::new(
            405,
            None,
            format_args!("method not allowed (this path takes {allow})"),
        );
        e.allow = Some(allow);
        e
    }

    /// 503 when the request queue is full (sent with `Retry-After`).
    pub fn queue_full() -> Self {
        Self::new(
            503,
            None,
            format_args!("the request queue is full; retry shortly"),
        )
    }

    /// 403 for a peer whose uid/gid is not allowed.
    pub fn forbidden() -> Self {
        Self::new(403, None, format_args!("this peer may not use the server"))
    }

    /// 500 with a message.
    pub fn server_error(message: &str) -> Self {
        Self::new(500, None, format_args!("{message}"))
    }

    /// OpenAI's `type`: `invalid_request_error` for 4xx, `server_error` for 5xx.
    pub fn error_type(&self) -> &'static str {
        if self.status >= 500 {
            "server_error"
        } else {
            "invalid_request_error"
        }
    }
}

impl From<HttpError> for ApiError {
    fn from(e: HttpError) -> Self {
        Self::new(e.status(), None, format_args!("{}", e.message()))
    }
}

/// An error response: `e` as OpenAI's JSON error shape ([`write_error`]) in its HTTP response.
/// `scratch` holds the body while its length is taken; [`ERROR_BODY_MAX`](super::ERROR_BODY_MAX)
/// bytes always suffice.
pub fn write_error_response<W: embedded_io::Write>(
    w: &mut W,
    e: &ApiError,
    scratch: &mut [u8],
) -> Result<(), W::Error> {
    let mut body = FixedBuf::new(scratch);
    let _ = write_error(&mut body, e);
    let len = body.len();
    http::write_error_body(w, e.status, e.allow, &scratch[..len])
}

/// OpenAI's error shape:
/// `{"error":{"message":"...","type":"invalid_request_error","param":"max_tokens","code":null}}`.
pub fn write_error(out: &mut impl Write, e: &ApiError) -> fmt::Result {
    out.write_char('{')?;
    write_error_member(out, e)?;
    out.write_char('}')
}

/// `"error":{...}` (the member [`write_error`] wraps), also closing a response whose text was
/// already sent when the engine failed.
pub fn write_error_member(out: &mut impl Write, e: &ApiError) -> fmt::Result {
    out.write_str("\"error\":{\"message\":")?;
    json::write_str(out, &e.message)?;
    write!(out, ",\"type\":\"{}\",\"param\":", e.error_type())?;
    match e.param {
        Some(p) => json::write_str(out, p)?,
        None => out.write_str("null")?,
    }
    out.write_str(",\"code\":null}")
}
