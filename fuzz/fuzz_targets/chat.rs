//! Fuzzes chat templates: `ChatFormat::detect` on arbitrary template text, and `render_into` of
//! arbitrary messages into a small buffer, in the detected format and in each fixed one.
//!
//! Input: byte 0 flags (bit 0 `add_generation_prompt`, bit 1 no template at all), byte 1 the
//! output buffer's size; the rest (invalid UTF-8 replaced by U+FFFD) split at NUL into the
//! template, then role, content, role, content, ... Properties:
//! - nothing panics; a detected ChatML default system prompt is not empty;
//! - `render_into` a small buffer: `Ok(n)` writes the whole prompt (= `render`); `TooLong` has
//!   `limit` = the buffer's size, `needed` = the prompt's length, and the buffer holds the
//!   prompt's first bytes; a buffer of `needed` bytes then takes the whole prompt.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run chat -- -max_len=2048`
#![no_main]

use leanstream::tokenizer::{ChatFormat, ChatMessage, RenderError};
use libfuzzer_sys::fuzz_target;

fn check(f: &ChatFormat, msgs: &[ChatMessage], gen: bool, size: usize) {
    let full = f.render(msgs, gen);
    let mut buf = vec![0xAAu8; size];
    match f.render_into(msgs, gen, &mut buf) {
        Ok(n) => {
            assert_eq!(n, full.len());
            assert_eq!(&buf[..n], full.as_bytes());
        }
        Err(RenderError::TooLong { needed, limit }) => {
            assert_eq!(limit, size);
            assert_eq!(needed, full.len());
            assert!(needed > limit);
            assert_eq!(&buf[..], &full.as_bytes()[..size]);
            let mut exact = vec![0u8; needed];
            assert_eq!(f.render_into(msgs, gen, &mut exact), Ok(needed));
            assert_eq!(exact, full.as_bytes());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, size, rest @ ..] = data else {
        return;
    };
    let gen = flags & 1 != 0;
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.split('\0');
    let template = parts.next().filter(|_| flags & 2 == 0);
    let parts: Vec<&str> = parts.collect();
    let msgs: Vec<ChatMessage> = parts
        .chunks(2)
        .take(64)
        .map(|p| ChatMessage {
            role: p[0],
            content: p.get(1).copied().unwrap_or(""),
        })
        .collect();
    let size = *size as usize;
    if let Ok(f) = ChatFormat::detect(template) {
        if let ChatFormat::ChatMl {
            default_system: Some(s),
        } = &f
        {
            assert!(!s.is_empty());
        }
        check(&f, &msgs, gen, size);
    }
    for f in [
        ChatFormat::ChatMl {
            default_system: None,
        },
        ChatFormat::ChatMl {
            default_system: Some("You are a helpful AI assistant named SmolLM".into()),
        },
        ChatFormat::Llama2,
        ChatFormat::Llama3,
    ] {
        check(&f, &msgs, gen, size);
    }
});
