//! [`Params`], the sampling and length fields both endpoints take, and the OpenAI fields this
//! server refuses unless given their "off" value.

use super::fields::{must_be, null, opt_int, opt_number, Fail, Text, KEY_SCRATCH};
use super::{ApiError, MAX_TOKENS_LIMIT};
use crate::engine::generate::{MAX_STOPS, MAX_STOP_BYTES};
use crate::serve::json::{self, Kind, Reader, Sink};

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
    pub(super) fn with_max_tokens(max_tokens: u32) -> Self {
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

/// Reads a field of [`Params`] if `key` names one; false if it does not (the value is unread).
pub(super) fn param_field<'a>(
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
