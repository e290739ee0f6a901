//! What both request parsers read with: the failure of a parse, the buffer unescaped strings
//! land in, and readers of one optional field's value.

use super::ApiError;
use crate::serve::json::{self, JsonError, Kind, Reader, Sink};

/// The failure of a parse: bad JSON (its message needs the reader's position) or a field error.
pub(super) enum Fail {
    Json(JsonError),
    Api(ApiError),
}

impl From<JsonError> for Fail {
    fn from(e: JsonError) -> Self {
        Fail::Json(e)
    }
}

impl From<ApiError> for Fail {
    fn from(e: ApiError) -> Self {
        Fail::Api(e)
    }
}

impl Fail {
    pub(super) fn into_api(self, pos: usize) -> ApiError {
        let what = match self {
            Fail::Api(e) => return e,
            Fail::Json(JsonError::NoRoom) => {
                return ApiError::new(413, None, format_args!("request too large"))
            }
            Fail::Json(JsonError::Syntax) => "request body is not valid JSON",
            Fail::Json(JsonError::Utf8) => "request body is not valid UTF-8",
            Fail::Json(JsonError::Escape) => "invalid escape in a JSON string",
            Fail::Json(JsonError::TooDeep) => "JSON nested too deeply",
        };
        ApiError::new(400, None, format_args!("{what} (at byte {pos})"))
    }
}

/// Where unescaped strings go: the unused tail of the caller's buffer. Committed strings are
/// split off the front and keep the buffer's lifetime.
pub(super) struct Text<'a> {
    pub(super) rest: &'a mut [u8],
}

impl<'a> Text<'a> {
    /// Unescapes the next string to `rest[at..]`; returns the end offset.
    pub(super) fn append(&mut self, r: &mut Reader, at: usize) -> Result<usize, JsonError> {
        let mut sink = Sink::new(self.rest, at);
        r.string(Some(&mut sink))?;
        sink.written().ok_or(JsonError::NoRoom)
    }

    pub(super) fn append_byte(&mut self, at: usize, b: u8) -> Result<usize, JsonError> {
        *self.rest.get_mut(at).ok_or(JsonError::NoRoom)? = b;
        Ok(at + 1)
    }

    /// Splits off `rest[..n]` as a string.
    pub(super) fn commit(&mut self, n: usize) -> &'a str {
        let (head, tail) = core::mem::take(&mut self.rest).split_at_mut(n);
        self.rest = tail;
        let head: &'a [u8] = head;
        core::str::from_utf8(head).expect("unescaped JSON strings are UTF-8")
    }

    pub(super) fn string(&mut self, r: &mut Reader) -> Result<&'a str, JsonError> {
        let n = self.append(r, 0)?;
        Ok(self.commit(n))
    }
}

pub(super) fn must_be(param: &'static str, what: &str) -> Fail {
    ApiError::invalid(param, format_args!("'{param}' must be {what}")).into()
}

pub(super) fn required(param: &'static str) -> Fail {
    ApiError::invalid(param, format_args!("'{param}' is required")).into()
}

/// Consumes a `null` if one comes next.
pub(super) fn null(r: &mut Reader) -> Result<bool, Fail> {
    if r.peek_kind()? == Kind::Null {
        r.null()?;
        return Ok(true);
    }
    Ok(false)
}

pub(super) fn opt_int(
    r: &mut Reader,
    param: &'static str,
    min: i128,
    max: i128,
) -> Result<Option<i128>, Fail> {
    if null(r)? {
        return Ok(None);
    }
    if r.peek_kind()? != Kind::Number {
        return Err(must_be(param, "an integer"));
    }
    let v = json::integer(r.number()?).ok_or_else(|| must_be(param, "an integer"))?;
    if v < min {
        return Err(
            ApiError::invalid(param, format_args!("'{param}' must be at least {min}")).into(),
        );
    }
    if v > max {
        return Err(
            ApiError::invalid(param, format_args!("'{param}' must be at most {max}")).into(),
        );
    }
    Ok(Some(v))
}

pub(super) fn opt_number(r: &mut Reader, param: &'static str) -> Result<Option<f64>, Fail> {
    if null(r)? {
        return Ok(None);
    }
    if r.peek_kind()? != Kind::Number {
        return Err(must_be(param, "a number"));
    }
    // JSON's number grammar is a subset of Rust's float syntax.
    let v: f64 = r
        .number()?
        .parse()
        .map_err(|_| must_be(param, "a number"))?;
    Ok(Some(v))
}

pub(super) fn opt_string<'a>(
    r: &mut Reader,
    t: &mut Text<'a>,
    param: &'static str,
) -> Result<Option<&'a str>, Fail> {
    if null(r)? {
        return Ok(None);
    }
    if r.peek_kind()? != Kind::String {
        return Err(must_be(param, "a string"));
    }
    Ok(Some(t.string(r)?))
}

/// Longest key this code knows ("max_completion_tokens" is 21 bytes).
pub(super) const KEY_SCRATCH: usize = 32;
