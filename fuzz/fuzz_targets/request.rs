//! Fuzzes the protocol layer: arbitrary bytes as a request (head, then body) must never panic.
//! A complete head's body goes to both API parsers with a text buffer as long as the body (which
//! must always suffice: a 413 from the parser would be a bug); a parsed request's strings must
//! sit inside that buffer; every error must render as valid JSON; the raw bytes also go through
//! the JSON validator and `Utf8Carry`.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run request -- -max_len=8192`
//! (seed corpus: a few valid requests in fuzz/corpus/request).
#![no_main]

use leanstream::serve::api::{self, ApiError, ERROR_BODY_MAX};
use leanstream::serve::http::{self, Route};
use leanstream::serve::json::{self, Utf8Carry};
use leanstream::serve::FixedBuf;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 16384;

/// An error renders as JSON; from a body parser it is never a 413 (the text buffer is as long
/// as the body), while the HTTP layer gives 413s for large Content-Lengths.
fn check_error(e: &ApiError, from_body: bool) {
    assert!(e.status >= 400 && e.status < 600);
    assert!(
        !(from_body && e.status == 413),
        "the text buffer is as long as the body"
    );
    let mut b = [0u8; ERROR_BODY_MAX];
    let mut f = FixedBuf::new(&mut b);
    api::write_error(&mut f, e).expect("ERROR_BODY_MAX holds any error");
    json::validate(f.as_bytes()).expect("error JSON");
}

/// `s` lies in the text buffer starting at address `b`, `len` bytes long.
fn inside(s: &str, (b, len): (usize, usize)) {
    let p = s.as_ptr() as usize;
    assert!(s.is_empty() || (p >= b && p + s.len() <= b + len));
}

fn body(bytes: &[u8]) {
    let mut text = [0u8; LIMIT];
    let text = &mut text[..bytes.len()];
    let text_range = (text.as_ptr() as usize, text.len());
    match api::parse_completion(bytes, text) {
        Ok(r) => {
            inside(r.prompt, text_range);
            for s in &r.params.stop {
                inside(s, text_range);
                assert!(!s.is_empty() && s.len() <= 128);
            }
            assert!(r.params.temperature >= 0.0 && r.params.temperature <= 2.0);
            assert!(r.params.top_p > 0.0 && r.params.top_p <= 1.0);
            json::validate(bytes).expect("accepted body is JSON");
        }
        Err(e) => check_error(&e, true),
    }
    let mut text = [0u8; LIMIT];
    let text = &mut text[..bytes.len()];
    let text_range = (text.as_ptr() as usize, text.len());
    let res = api::parse_chat(bytes, text);
    match res {
        Ok(r) => {
            assert!(!r.messages.is_empty());
            for m in &r.messages {
                inside(m.content, text_range);
                assert!(matches!(m.role, "system" | "user" | "assistant"));
            }
            json::validate(bytes).expect("accepted body is JSON");
        }
        Err(e) => check_error(&e, true),
    }
}

fuzz_target!(|data: &[u8]| {
    // The JSON validator and the escaper on the raw bytes.
    let _ = json::validate(data);
    let mut out = [0u8; 8 * 8192 + 16];
    let mut f = FixedBuf::new(&mut out);
    let mut carry = Utf8Carry::new();
    for piece in data.chunks(3) {
        carry.push(piece, &mut f).expect("room");
    }
    carry.finish(&mut f).expect("room");
    let mut want = [0u8; 8 * 8192 + 16];
    let mut w = FixedBuf::new(&mut want);
    json::write_escaped(&mut w, &String::from_utf8_lossy(data)).expect("room");
    assert_eq!(
        f.as_str(),
        w.as_str(),
        "Utf8Carry in pieces of 3 = lossy + escape"
    );

    // As a request.
    let data = &data[..data.len().min(LIMIT)];
    match http::parse_head_limited(data, LIMIT) {
        Ok(Some(head)) => {
            let route = http::route(head.method, head.path(data));
            if head.path(data).starts_with("/v1/models") && head.method == http::Method::Get {
                assert!(matches!(route, Route::Models | Route::NotFound));
            }
            assert!(head.head_len <= data.len());
            let end = head.total_len().min(data.len());
            assert!(head.total_len() <= LIMIT);
            body(&data[head.head_len..end]);
        }
        Ok(None) => assert!(data.len() < LIMIT),
        Err(e) => check_error(&e.into(), false),
    }
    // Also the whole input as a body.
    body(data);
});
