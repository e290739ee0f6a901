//! The OpenAI API subset: request bodies parsed into fixed buffers, OpenAI-shaped errors, and
//! the JSON of responses, stream chunks, the model list and health. Nothing allocates.
//!
//! Requests: [`parse_completion`] (`POST /v1/completions`) and [`parse_chat`]
//! (`POST /v1/chat/completions`). Every string is unescaped into the caller's `text` buffer and
//! the request borrows from it; a `text` buffer as long as the body always suffices (an
//! unescaped string is never longer than its JSON form). Field rules:
//!
//! - `model`: a string (or null), not checked against the loaded model.
//! - `prompt` (completions, required): a string, or an array of exactly one string.
//! - `messages` (chat, required): 1 to [`MAX_MESSAGES`] objects `{role, content}`; `role` is
//!   `system` (or `developer`, OpenAI's newer name for it), `user` or `assistant`; `content` is a string, or an array of `{"type":"text",
//!   "text":...}` parts (joined with `\n`). Other message keys are ignored.
//! - `max_tokens` (chat also `max_completion_tokens`): integer in `0..=board::MAX_CONTEXT`;
//!   default [`DEFAULT_MAX_TOKENS`] for completions (OpenAI's), `MAX_CONTEXT` for chat (the
//!   server caps it by the room left in the context).
//! - `temperature`: number in `0..=2`, default 1. `top_p`: number in `(0, 1]`, default 1.
//!   `top_k`: integer `>= 0` (an extension; 0 = off), default 0. `seed`: integer (negative
//!   seeds are taken modulo 2^64), default none.
//! - `stop`: a string or an array of at most `MAX_STOPS` strings of at most `MAX_STOP_BYTES`
//!   bytes each; empty strings are dropped.
//! - `stream`: boolean. `n`: only 1.
//! - Fields this server does not implement (`echo`, `logprobs`, `top_logprobs`, `best_of`,
//!   `suffix`, `response_format`, `tools`, `tool_choice`, `functions`, `function_call`,
//!   `logit_bias`) are a 400 naming the field, unless given their "off" value (`null`, `false`,
//!   `0` for `top_logprobs`, `1` for `best_of`, `""`, `[]`, `{}`, `"none"`,
//!   `{"type":"text"}`).
//! - Any optional field may be `null` (= absent). Unknown fields are skipped (validated as JSON).
//!
//! A wrong type is a 400 naming the field (`'max_tokens' must be an integer`, param
//! `max_tokens`); so is a value out of range. Invalid JSON or UTF-8 is a 400 with the byte
//! offset; a `text` buffer too small is a 413.

// An `ApiError` carries its message inline (a 256-byte heapless string), so results carrying it
// are large; boxing it, as clippy suggests, is the heap allocation this layer must not do.
#![allow(clippy::result_large_err, clippy::large_enum_variant)]

use super::http::HttpError;
use super::json::{self, JsonError, Kind, Reader, Sink, Utf8Carry};
use crate::engine::generate::{FinishReason, MAX_STOPS, MAX_STOP_BYTES};
use crate::tokenizer::chat::ChatMessage;
use core::fmt::{self, Write};

/// Messages per chat request.
pub const MAX_MESSAGES: usize = 32;
/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Largest accepted `max_tokens`.
pub const MAX_TOKENS_LIMIT: u32 = crate::board::MAX_CONTEXT as u32;
/// Bytes that always hold the JSON of an [`ApiError`] (a 256-byte message escaped at most 6x).
pub const ERROR_BODY_MAX: usize = 2048;

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

/// Sampling and length settings shared by both endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct Params<'a> {
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: Option<u64>,
    /// Non-empty stop strings, each at most `MAX_STOP_BYTES`.
    pub stop: heapless::Vec<&'a str, MAX_STOPS>,
    pub stream: bool,
}

impl Params<'_> {
    fn with_max_tokens(max_tokens: u32) -> Self {
        Params {
            max_tokens,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            stop: heapless::Vec::new(),
            stream: false,
        }
    }
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest<'a> {
    pub model: Option<&'a str>,
    pub prompt: &'a str,
    pub params: Params<'a>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest<'a> {
    pub model: Option<&'a str>,
    /// Roles are the `'static` strings "system", "user", "assistant".
    pub messages: heapless::Vec<ChatMessage<'a>, MAX_MESSAGES>,
    pub params: Params<'a>,
}

/// Parses a `/v1/completions` body. Strings land in `text` (give it at least `body.len()`
/// bytes).
pub fn parse_completion<'a>(
    body: &[u8],
    text: &'a mut [u8],
) -> Result<CompletionRequest<'a>, ApiError> {
    let mut r = Reader::new(body);
    let mut t = Text { rest: text };
    completion(&mut r, &mut t).map_err(|f| f.into_api(r.pos()))
}

/// Parses a `/v1/chat/completions` body. Strings land in `text` (give it at least `body.len()`
/// bytes).
pub fn parse_chat<'a>(body: &[u8], text: &'a mut [u8]) -> Result<ChatRequest<'a>, ApiError> {
    let mut r = Reader::new(body);
    let mut t = Text { rest: text };
    chat(&mut r, &mut t).map_err(|f| f.into_api(r.pos()))
}

/// The failure of a parse: bad JSON (its message needs the reader's position) or a field error.
enum Fail {
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
    fn into_api(self, pos: usize) -> ApiError {
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
struct Text<'a> {
    rest: &'a mut [u8],
}

impl<'a> Text<'a> {
    /// Unescapes the next string to `rest[at..]`; returns the end offset.
    fn append(&mut self, r: &mut Reader, at: usize) -> Result<usize, JsonError> {
        let mut sink = Sink::new(self.rest, at);
        r.string(Some(&mut sink))?;
        sink.written().ok_or(JsonError::NoRoom)
    }

    fn append_byte(&mut self, at: usize, b: u8) -> Result<usize, JsonError> {
        *self.rest.get_mut(at).ok_or(JsonError::NoRoom)? = b;
        Ok(at + 1)
    }

    /// Splits off `rest[..n]` as a string.
    fn commit(&mut self, n: usize) -> &'a str {
        let (head, tail) = core::mem::take(&mut self.rest).split_at_mut(n);
        self.rest = tail;
        let head: &'a [u8] = head;
        core::str::from_utf8(head).expect("unescaped JSON strings are UTF-8")
    }

    fn string(&mut self, r: &mut Reader) -> Result<&'a str, JsonError> {
        let n = self.append(r, 0)?;
        Ok(self.commit(n))
    }
}

fn must_be(param: &'static str, what: &str) -> Fail {
    ApiError::invalid(param, format_args!("'{param}' must be {what}")).into()
}

fn required(param: &'static str) -> Fail {
    ApiError::invalid(param, format_args!("'{param}' is required")).into()
}

/// Consumes a `null` if one comes next.
fn null(r: &mut Reader) -> Result<bool, Fail> {
    if r.peek_kind()? == Kind::Null {
        r.null()?;
        return Ok(true);
    }
    Ok(false)
}

fn opt_int(
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

fn opt_number(r: &mut Reader, param: &'static str) -> Result<Option<f64>, Fail> {
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

fn opt_string<'a>(
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

/// Reads a field of [`Params`] if `key` names one; false if it does not (the value is unread).
fn param_field<'a>(
    key: &str,
    r: &mut Reader,
    t: &mut Text<'a>,
    p: &mut Params<'a>,
) -> Result<bool, Fail> {
    match key {
        "max_tokens" | "max_completion_tokens" => {
            let param = if key == "max_tokens" {
                "max_tokens"
            } else {
                "max_completion_tokens"
            };
            if let Some(v) = opt_int(r, param, 0, MAX_TOKENS_LIMIT as i128)? {
                p.max_tokens = v as u32;
            }
        }
        "temperature" => {
            if let Some(v) = opt_number(r, "temperature")? {
                if !(0.0..=2.0).contains(&v) {
                    return Err(must_be("temperature", "between 0 and 2"));
                }
                p.temperature = v as f32;
            }
        }
        "top_p" => {
            if let Some(v) = opt_number(r, "top_p")? {
                if !(v > 0.0 && v <= 1.0) {
                    return Err(must_be("top_p", "greater than 0 and at most 1"));
                }
                p.top_p = v as f32;
            }
        }
        "top_k" => {
            if let Some(v) = opt_int(r, "top_k", 0, u32::MAX as i128)? {
                p.top_k = v as u32;
            }
        }
        "seed" => {
            p.seed = opt_int(r, "seed", i64::MIN as i128, u64::MAX as i128)?.map(|v| v as u64);
        }
        "stream" => {
            if !null(r)? {
                if r.peek_kind()? != Kind::Bool {
                    return Err(must_be("stream", "a boolean"));
                }
                p.stream = r.boolean()?;
            }
        }
        "n" => {
            if null(r)? {
                return Ok(true);
            }
            if r.peek_kind()? != Kind::Number {
                return Err(must_be("n", "an integer"));
            }
            match json::integer(r.number()?) {
                Some(1) => {}
                Some(_) => return Err(must_be("n", "1 (one choice per request)")),
                None => return Err(must_be("n", "an integer")),
            }
        }
        "stop" => {
            p.stop.clear();
            match r.peek_kind()? {
                Kind::Null => r.null()?,
                Kind::String => push_stop(t.string(r)?, &mut p.stop)?,
                Kind::Array => {
                    r.begin_array()?;
                    let mut first = true;
                    let mut count = 0;
                    while r.next_element(&mut first)? {
                        if r.peek_kind()? != Kind::String {
                            return Err(must_be("stop", "a string or an array of strings"));
                        }
                        count += 1;
                        if count > MAX_STOPS {
                            return Err(ApiError::invalid(
                                "stop",
                                format_args!("'stop' may hold at most {MAX_STOPS} strings"),
                            )
                            .into());
                        }
                        push_stop(t.string(r)?, &mut p.stop)?;
                    }
                }
                _ => return Err(must_be("stop", "a string or an array of strings")),
            }
        }
        _ => return unsupported_field(key, r),
    }
    Ok(true)
}

/// OpenAI fields this server does not implement. A request that uses one is a 400 naming it,
/// rather than an answer that silently ignores it; the value that means "off" is accepted.
const UNSUPPORTED: [&str; 11] = [
    "echo",
    "logprobs",
    "top_logprobs",
    "best_of",
    "suffix",
    "response_format",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "logit_bias",
];

/// Reads the value of `key` if it is one of [`UNSUPPORTED`]: `null` and each field's "off" value
/// (`false`, `0`, `1` for `best_of`, `""`, `[]`, `{}`, `"none"`, `{"type":"text"}`) pass;
/// anything else is a 400. False (the value is unread) for any other key.
fn unsupported_field(key: &str, r: &mut Reader) -> Result<bool, Fail> {
    let Some(&param) = UNSUPPORTED.iter().find(|&&k| k == key) else {
        return Ok(false);
    };
    let mut scratch = [0u8; KEY_SCRATCH];
    let off = match r.peek_kind()? {
        Kind::Null => {
            r.null()?;
            true
        }
        Kind::Bool => !r.boolean()? && matches!(param, "echo" | "logprobs"),
        Kind::Number => {
            let n = json::integer(r.number()?);
            match param {
                "top_logprobs" => n == Some(0),
                "best_of" => n == Some(1),
                _ => false,
            }
        }
        Kind::String => {
            let mut sink = Sink::new(&mut scratch, 0);
            r.string(Some(&mut sink))?;
            match param {
                "suffix" => sink.written() == Some(0),
                "tool_choice" | "function_call" => sink.as_str() == Some("none"),
                _ => false,
            }
        }
        Kind::Array => {
            r.begin_array()?;
            let mut first = true;
            let empty = !r.next_element(&mut first)?;
            if !empty {
                r.skip_value()?;
                while r.next_element(&mut first)? {
                    r.skip_value()?;
                }
            }
            empty && matches!(param, "tools" | "functions")
        }
        Kind::Object => {
            r.begin_object()?;
            let mut first = true;
            let mut members = 0;
            let mut text_type = false;
            while r.next_member(&mut first)? {
                members += 1;
                let is_type = r.key(&mut scratch)? == Some("type");
                if is_type && r.peek_kind()? == Kind::String {
                    let mut sink = Sink::new(&mut scratch, 0);
                    r.string(Some(&mut sink))?;
                    text_type = sink.as_str() == Some("text");
                } else {
                    r.skip_value()?;
                }
            }
            match param {
                "logit_bias" => members == 0,
                "response_format" => members == 1 && text_type,
                _ => false,
            }
        }
    };
    if off {
        Ok(true)
    } else {
        Err(ApiError::invalid(
            param,
            format_args!("'{param}' is not supported by this server"),
        )
        .into())
    }
}

fn push_stop<'a>(s: &'a str, stop: &mut heapless::Vec<&'a str, MAX_STOPS>) -> Result<(), Fail> {
    if s.len() > MAX_STOP_BYTES {
        return Err(ApiError::invalid(
            "stop",
            format_args!("'stop' strings must be at most {MAX_STOP_BYTES} bytes"),
        )
        .into());
    }
    if !s.is_empty() {
        // The caller counted: at most MAX_STOPS strings arrive.
        let _ = stop.push(s);
    }
    Ok(())
}

/// Consumes the `{` of the body's top-level object.
fn begin_body(r: &mut Reader) -> Result<(), Fail> {
    match r.peek_kind()? {
        Kind::Object => Ok(r.begin_object()?),
        _ => Err(ApiError::bad_request("request body must be a JSON object").into()),
    }
}

/// Longest key this code knows ("max_completion_tokens" is 21 bytes).
const KEY_SCRATCH: usize = 32;

fn completion<'a>(r: &mut Reader, t: &mut Text<'a>) -> Result<CompletionRequest<'a>, Fail> {
    begin_body(r)?;
    let mut scratch = [0u8; KEY_SCRATCH];
    let mut model = None;
    let mut prompt = None;
    let mut params = Params::with_max_tokens(DEFAULT_MAX_TOKENS);
    let mut first = true;
    while r.next_member(&mut first)? {
        let key = r.key(&mut scratch)?.unwrap_or("");
        match key {
            "model" => model = opt_string(r, t, "model")?,
            "prompt" => {
                prompt = match r.peek_kind()? {
                    Kind::Null => {
                        r.null()?;
                        None
                    }
                    Kind::String => Some(t.string(r)?),
                    Kind::Array => {
                        let bad = || must_be("prompt", "a string or an array of one string");
                        r.begin_array()?;
                        let mut first = true;
                        if !r.next_element(&mut first)? || r.peek_kind()? != Kind::String {
                            return Err(bad());
                        }
                        let s = t.string(r)?;
                        if r.next_element(&mut first)? {
                            return Err(bad());
                        }
                        Some(s)
                    }
                    _ => return Err(must_be("prompt", "a string or an array of one string")),
                }
            }
            _ => {
                if !param_field(key, r, t, &mut params)? {
                    r.skip_value()?;
                }
            }
        }
    }
    r.end()?;
    Ok(CompletionRequest {
        model,
        prompt: prompt.ok_or_else(|| required("prompt"))?,
        params,
    })
}

fn chat<'a>(r: &mut Reader, t: &mut Text<'a>) -> Result<ChatRequest<'a>, Fail> {
    begin_body(r)?;
    let mut scratch = [0u8; KEY_SCRATCH];
    let mut model = None;
    let mut messages = heapless::Vec::new();
    let mut seen_messages = false;
    let mut params = Params::with_max_tokens(MAX_TOKENS_LIMIT);
    let mut first = true;
    while r.next_member(&mut first)? {
        let key = r.key(&mut scratch)?.unwrap_or("");
        match key {
            "model" => model = opt_string(r, t, "model")?,
            "messages" => {
                if r.peek_kind()? != Kind::Array {
                    return Err(must_be("messages", "an array of message objects"));
                }
                seen_messages = true;
                messages.clear();
                r.begin_array()?;
                let mut first = true;
                while r.next_element(&mut first)? {
                    if messages.is_full() {
                        return Err(ApiError::invalid(
                            "messages",
                            format_args!("'messages' may hold at most {MAX_MESSAGES} messages"),
                        )
                        .into());
                    }
                    let m = message(r, t, messages.len())?;
                    let _ = messages.push(m);
                }
            }
            _ => {
                if !param_field(key, r, t, &mut params)? {
                    r.skip_value()?;
                }
            }
        }
    }
    r.end()?;
    if !seen_messages {
        return Err(required("messages"));
    }
    if messages.is_empty() {
        return Err(must_be("messages", "a non-empty array"));
    }
    Ok(ChatRequest {
        model,
        messages,
        params,
    })
}

fn message_error(i: usize, what: fmt::Arguments) -> Fail {
    ApiError::invalid("messages", format_args!("'messages[{i}]{what}")).into()
}

/// One message object, the `i`th.
fn message<'a>(r: &mut Reader, t: &mut Text<'a>, i: usize) -> Result<ChatMessage<'a>, Fail> {
    if r.peek_kind()? != Kind::Object {
        return Err(message_error(i, format_args!("' must be an object")));
    }
    r.begin_object()?;
    let mut scratch = [0u8; KEY_SCRATCH];
    let mut role = None;
    let mut content = None;
    let mut first = true;
    while r.next_member(&mut first)? {
        match r.key(&mut scratch)?.unwrap_or("") {
            "role" => {
                let bad = || {
                    message_error(
                        i,
                        format_args!(".role' must be one of system, developer, user, assistant"),
                    )
                };
                if r.peek_kind()? != Kind::String {
                    return Err(bad());
                }
                let mut sink = Sink::new(&mut scratch, 0);
                r.string(Some(&mut sink))?;
                role = Some(match sink.as_str() {
                    // OpenAI's newer name for the system role, which current clients send.
                    Some("system") | Some("developer") => "system",
                    Some("user") => "user",
                    Some("assistant") => "assistant",
                    _ => return Err(bad()),
                });
            }
            "content" => content = Some(message_content(r, t, i)?),
            _ => r.skip_value()?,
        }
    }
    Ok(ChatMessage {
        role: role.ok_or_else(|| message_error(i, format_args!(".role' is required")))?,
        content: content.ok_or_else(|| message_error(i, format_args!(".content' is required")))?,
    })
}

/// A message's content: a string, or text parts joined with `\n`.
fn message_content<'a>(r: &mut Reader, t: &mut Text<'a>, i: usize) -> Result<&'a str, Fail> {
    let bad = || {
        message_error(
            i,
            format_args!(".content' must be a string or an array of text parts"),
        )
    };
    match r.peek_kind()? {
        Kind::String => return Ok(t.string(r)?),
        Kind::Array => {}
        _ => return Err(bad()),
    }
    r.begin_array()?;
    let mut n = 0;
    let mut first = true;
    let mut scratch = [0u8; KEY_SCRATCH];
    while r.next_element(&mut first)? {
        if r.peek_kind()? != Kind::Object {
            return Err(bad());
        }
        r.begin_object()?;
        if n > 0 {
            n = t.append_byte(n, b'\n')?;
        }
        let mut is_text = false;
        let mut first_member = true;
        while r.next_member(&mut first_member)? {
            match r.key(&mut scratch)?.unwrap_or("") {
                "type" => {
                    if r.peek_kind()? != Kind::String {
                        return Err(bad());
                    }
                    let mut sink = Sink::new(&mut scratch, 0);
                    r.string(Some(&mut sink))?;
                    is_text = sink.as_str() == Some("text");
                    if !is_text {
                        return Err(message_error(
                            i,
                            format_args!(".content' parts must be of type 'text'"),
                        ));
                    }
                }
                "text" => {
                    if r.peek_kind()? != Kind::String {
                        return Err(bad());
                    }
                    n = t.append(r, n)?;
                }
                _ => r.skip_value()?,
            }
        }
        if !is_text {
            return Err(message_error(
                i,
                format_args!(".content' parts must be of type 'text'"),
            ));
        }
    }
    Ok(t.commit(n))
}

// ---------------------------------------------------------------------------------------------
// Responses

/// What every response object names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseMeta<'m> {
    /// Written as `cmpl-{id}` / `chatcmpl-{id}`.
    pub id: u64,
    /// Unix seconds.
    pub created: u64,
    pub model: &'m str,
}

/// Token counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// OpenAI's `finish_reason`: `Cancelled` (the client went away; no one reads it) is written as
/// "stop".
fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Error => "error",
    }
}

fn write_usage(out: &mut impl Write, u: &Usage) -> fmt::Result {
    write!(
        out,
        "\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
        u.prompt_tokens,
        u.completion_tokens,
        u.prompt_tokens + u.completion_tokens
    )
}

fn write_meta(out: &mut impl Write, prefix: &str, object: &str, m: &ResponseMeta) -> fmt::Result {
    write!(
        out,
        "{{\"id\":\"{prefix}-{}\",\"object\":\"{object}\",\"created\":{},\"model\":",
        m.id, m.created
    )?;
    json::write_str(out, m.model)
}

/// The whole `/v1/completions` response. `text` is the generated bytes (not necessarily UTF-8:
/// invalid bytes become U+FFFD).
pub fn write_completion(
    out: &mut impl Write,
    meta: &ResponseMeta,
    text: &[u8],
    finish: FinishReason,
    usage: &Usage,
) -> fmt::Result {
    let mut carry = Utf8Carry::new();
    write_completion_open(out, meta)?;
    carry.push(text, out)?;
    write_completion_close(out, &mut carry, finish, usage, None)
}

/// The `/v1/completions` response up to the opening quote of its text, for a response sent
/// while it is generated: then the text through a [`Utf8Carry`], then
/// [`write_completion_close`]. Together they write what [`write_completion`] writes.
pub fn write_completion_open(out: &mut impl Write, meta: &ResponseMeta) -> fmt::Result {
    write_meta(out, "cmpl", "text_completion", meta)?;
    out.write_str(",\"choices\":[{\"index\":0,\"text\":\"")
}

/// The rest of a `/v1/completions` response after its text (see [`write_completion_open`]).
pub fn write_completion_close(
    out: &mut impl Write,
    carry: &mut Utf8Carry,
    finish: FinishReason,
    usage: &Usage,
    error: Option<&ApiError>,
) -> fmt::Result {
    carry.finish(out)?;
    write!(
        out,
        "\",\"finish_reason\":\"{}\",\"logprobs\":null}}],",
        finish_str(finish)
    )?;
    write_usage(out, usage)?;
    close_with(out, error)
}

/// A response's last `}`, after the `error` member when the engine failed.
fn close_with(out: &mut impl Write, error: Option<&ApiError>) -> fmt::Result {
    if let Some(e) = error {
        out.write_char(',')?;
        write_error_member(out, e)?;
    }
    out.write_char('}')
}

/// The whole `/v1/chat/completions` response.
pub fn write_chat_completion(
    out: &mut impl Write,
    meta: &ResponseMeta,
    text: &[u8],
    finish: FinishReason,
    usage: &Usage,
) -> fmt::Result {
    let mut carry = Utf8Carry::new();
    write_chat_completion_open(out, meta)?;
    carry.push(text, out)?;
    write_chat_completion_close(out, &mut carry, finish, usage, None)
}

/// The `/v1/chat/completions` response up to the opening quote of its content (see
/// [`write_completion_open`]).
pub fn write_chat_completion_open(out: &mut impl Write, meta: &ResponseMeta) -> fmt::Result {
    write_meta(out, "chatcmpl", "chat.completion", meta)?;
    out.write_str(",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"")
}

/// The rest of a `/v1/chat/completions` response after its content.
pub fn write_chat_completion_close(
    out: &mut impl Write,
    carry: &mut Utf8Carry,
    finish: FinishReason,
    usage: &Usage,
    error: Option<&ApiError>,
) -> fmt::Result {
    carry.finish(out)?;
    write!(
        out,
        "\"}},\"finish_reason\":\"{}\",\"logprobs\":null}}],",
        finish_str(finish)
    )?;
    write_usage(out, usage)?;
    close_with(out, error)
}

/// A streamed `/v1/completions` chunk carrying the complete characters of `carry` + `bytes`
/// (an incomplete character stays in `carry` for the next chunk; the text may be empty).
pub fn write_completion_chunk(
    out: &mut impl Write,
    meta: &ResponseMeta,
    carry: &mut Utf8Carry,
    bytes: &[u8],
) -> fmt::Result {
    write_meta(out, "cmpl", "text_completion", meta)?;
    out.write_str(",\"choices\":[{\"index\":0,\"text\":\"")?;
    carry.push(bytes, out)?;
    out.write_str("\",\"finish_reason\":null,\"logprobs\":null}]}")
}

/// The last streamed `/v1/completions` chunk: the finish reason, any held incomplete character
/// as U+FFFD, and `usage` if given.
pub fn write_completion_final_chunk(
    out: &mut impl Write,
    meta: &ResponseMeta,
    carry: &mut Utf8Carry,
    finish: FinishReason,
    usage: Option<&Usage>,
) -> fmt::Result {
    write_meta(out, "cmpl", "text_completion", meta)?;
    out.write_str(",\"choices\":[{\"index\":0,\"text\":\"")?;
    carry.finish(out)?;
    write!(
        out,
        "\",\"finish_reason\":\"{}\",\"logprobs\":null}}]",
        finish_str(finish)
    )?;
    if let Some(u) = usage {
        out.write_char(',')?;
        write_usage(out, u)?;
    }
    out.write_char('}')
}

/// The first streamed chat chunk: `"delta":{"role":"assistant","content":""}`.
pub fn write_chat_role_chunk(out: &mut impl Write, meta: &ResponseMeta) -> fmt::Result {
    write_meta(out, "chatcmpl", "chat.completion.chunk", meta)?;
    out.write_str(
        ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\
         \"finish_reason\":null,\"logprobs\":null}]}",
    )
}

/// A streamed chat chunk: `"delta":{"content":"..."}` with the complete characters of
/// `carry` + `bytes`.
pub fn write_chat_chunk(
    out: &mut impl Write,
    meta: &ResponseMeta,
    carry: &mut Utf8Carry,
    bytes: &[u8],
) -> fmt::Result {
    write_meta(out, "chatcmpl", "chat.completion.chunk", meta)?;
    out.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"")?;
    carry.push(bytes, out)?;
    out.write_str("\"},\"finish_reason\":null,\"logprobs\":null}]}")
}

/// The last streamed chat chunk: an empty delta (or U+FFFD for a held incomplete character),
/// the finish reason, and `usage` if given.
pub fn write_chat_final_chunk(
    out: &mut impl Write,
    meta: &ResponseMeta,
    carry: &mut Utf8Carry,
    finish: FinishReason,
    usage: Option<&Usage>,
) -> fmt::Result {
    write_meta(out, "chatcmpl", "chat.completion.chunk", meta)?;
    out.write_str(",\"choices\":[{\"index\":0,\"delta\":{")?;
    if !carry.pending().is_empty() {
        out.write_str("\"content\":\"")?;
        carry.finish(out)?;
        out.write_char('"')?;
    }
    write!(
        out,
        "}},\"finish_reason\":\"{}\",\"logprobs\":null}}]",
        finish_str(finish)
    )?;
    if let Some(u) = usage {
        out.write_char(',')?;
        write_usage(out, u)?;
    }
    out.write_char('}')
}

/// `GET /v1/models`: the one loaded model.
pub fn write_models(out: &mut impl Write, model: &str, created: u64) -> fmt::Result {
    out.write_str("{\"object\":\"list\",\"data\":[{\"id\":")?;
    json::write_str(out, model)?;
    write!(
        out,
        ",\"object\":\"model\",\"created\":{created},\"owned_by\":\"leanstream\"}}]}}"
    )
}

/// `GET /health`: `{"status":"ok","model":NAME}`, or `"stalled"` when the engine has made no
/// progress for too long (answered with a 503).
pub fn write_health(out: &mut impl Write, model: &str, stalled: bool) -> fmt::Result {
    let status = if stalled { "stalled" } else { "ok" };
    write!(out, "{{\"status\":\"{status}\",\"model\":")?;
    json::write_str(out, model)?;
    out.write_char('}')
}

/// An error response: `e` as OpenAI's JSON error shape ([`write_error`]) in its HTTP response.
/// `scratch` holds the body while its length is taken; [`ERROR_BODY_MAX`] bytes always
/// suffice.
pub fn write_error_response<W: embedded_io::Write>(
    w: &mut W,
    e: &ApiError,
    scratch: &mut [u8],
) -> Result<(), W::Error> {
    let mut body = super::FixedBuf::new(scratch);
    let _ = write_error(&mut body, e);
    let len = body.len();
    super::http::write_error_body(w, e.status, e.allow, &scratch[..len])
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

#[cfg(test)]
mod tests;
