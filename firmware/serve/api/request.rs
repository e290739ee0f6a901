//! The two request bodies: [`parse_completion`] and [`parse_chat`], down to each chat message
//! (the field rules are in the module doc of [`super`]).

use super::fields::{must_be, opt_string, required, Fail, Text, KEY_SCRATCH};
use super::params::{param_field, Params};
use super::{ApiError, DEFAULT_MAX_TOKENS, MAX_MESSAGES, MAX_TOKENS_LIMIT};
use crate::serve::json::{Kind, Reader, Sink};
use crate::tokenizer::chat::ChatMessage;
use core::fmt;

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

/// Consumes the `{` of the body's top-level object.
fn begin_body(r: &mut Reader) -> Result<(), Fail> {
    match r.peek_kind()? {
        Kind::Object => Ok(r.begin_object()?),
        _ => Err(ApiError::bad_request("request body must be a JSON object").into()),
    }
}

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
