//! The OpenAI API subset: request bodies parsed into fixed buffers, OpenAI-shaped errors, and
//! the JSON of responses, stream chunks, the model list and health. Nothing allocates.
//!
//! In files by meaning: `request` (the two bodies and chat messages), `params` (the sampling
//! fields both take, and the refused OpenAI fields), `fields` (typed readers of one value, the
//! text buffer), `response` (the writers) and `error` ([`ApiError`] and its JSON).
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

mod error;
mod fields;
mod params;
mod request;
mod response;

pub use error::{write_error, write_error_member, write_error_response, ApiError};
pub use params::Params;
pub use request::{parse_chat, parse_completion, ChatRequest, CompletionRequest};
pub use response::{
    write_chat_chunk, write_chat_completion, write_chat_completion_close,
    write_chat_completion_open, write_chat_final_chunk, write_chat_role_chunk, write_completion,
    write_completion_chunk, write_completion_close, write_completion_final_chunk,
    write_completion_open, write_health, write_models, ResponseMeta, Usage,
};

/// Messages per chat request.
pub const MAX_MESSAGES: usize = 32;
/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Largest accepted `max_tokens`.
pub const MAX_TOKENS_LIMIT: u32 = crate::board::MAX_CONTEXT as u32;
/// Bytes that always hold the JSON of an [`ApiError`] (a 256-byte message escaped at most 6x).
pub const ERROR_BODY_MAX: usize = 2048;

#[cfg(test)]
mod tests;
