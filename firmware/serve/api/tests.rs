//! The OpenAI request parsers and response writers, on good and bad input.

use super::*;
use crate::engine::generate::{FinishReason, MAX_STOP_BYTES};
use crate::serve::json::{self, Utf8Carry};
use crate::serve::FixedBuf;
use crate::tokenizer::chat::ChatMessage;
use core::fmt;
use std::string::String;

fn completion(body: &str) -> Result<CompletionRequest<'static>, ApiError> {
    let text = Box::leak(vec![0u8; body.len()].into_boxed_slice());
    parse_completion(body.as_bytes(), text)
}

fn chat(body: &str) -> Result<ChatRequest<'static>, ApiError> {
    let text = Box::leak(vec![0u8; body.len()].into_boxed_slice());
    parse_chat(body.as_bytes(), text)
}

/// The error's status, param and message; its JSON must be valid and OpenAI-shaped.
fn err(e: ApiError) -> (u16, Option<&'static str>, String) {
    let j = error_json(&e);
    json::validate(j.as_bytes()).unwrap();
    assert!(j.starts_with("{\"error\":{\"message\":"));
    assert!(j.ends_with(",\"code\":null}}"));
    (e.status, e.param, e.message.as_str().into())
}

fn error_json(e: &ApiError) -> String {
    let mut b = [0u8; ERROR_BODY_MAX];
    let mut f = FixedBuf::new(&mut b);
    write_error(&mut f, e).unwrap();
    f.as_str().into()
}

fn field_err(body: &str) -> (u16, Option<&'static str>, String) {
    err(completion(body).unwrap_err())
}

#[test]
fn minimal_completion_has_defaults() {
    let r = completion(r#"{"prompt":"Hello"}"#).unwrap();
    assert_eq!(r.prompt, "Hello");
    assert_eq!(r.model, None);
    assert_eq!(r.params, Params::with_max_tokens(16));
}

#[test]
fn full_completion() {
    let r = completion(
        r#" { "model" : "qwen", "prompt": ["Once\nupon"], "max_tokens": 100,
            "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -1, "stop": ["\n\n", "END"],
            "stream": true, "n": 1, "logprobs": null, "echo": false, "unknown": {"a": [1, {"b": null}]},
            "stream_options": {"include_usage": true} } "#,
    )
    .unwrap();
    assert_eq!(r.model, Some("qwen"));
    assert_eq!(r.prompt, "Once\nupon");
    let p = &r.params;
    assert_eq!(
        (p.max_tokens, p.temperature, p.top_p, p.top_k),
        (100, 0.5, 0.9, 40)
    );
    assert_eq!(p.seed, Some(u64::MAX));
    assert_eq!(p.stop.as_slice(), ["\n\n", "END"]);
    assert!(p.stream);
}

#[test]
fn nulls_are_absent() {
    let r = completion(
        r#"{"prompt":"x","model":null,"max_tokens":null,"temperature":null,"top_p":null,
           "top_k":null,"seed":null,"stop":null,"stream":null,"n":null}"#,
    )
    .unwrap();
    assert_eq!(r.params, Params::with_max_tokens(16));
}

#[test]
fn escapes_and_surrogate_pairs() {
    let r = completion(r#"{"prompt":"a\"b\\c\/d\b\f\n\r\t\u00e9\u4e2d\ud83d\ude00 é中😀 \u0000"}"#)
        .unwrap();
    assert_eq!(r.prompt, "a\"b\\c/d\u{8}\u{c}\n\r\té中😀 é中😀 \0");
    // Escaped keys are keys too.
    let r = completion(r#"{"prom\u0070t":"x","max\u005ftokens":3}"#).unwrap();
    assert_eq!((r.prompt, r.params.max_tokens), ("x", 3));
}

#[test]
fn bad_escapes_and_utf8_are_400() {
    for body in [
        r#"{"prompt":"\ud83d"}"#, // lone high surrogate
        r#"{"prompt":"\ud83dx"}"#,
        r#"{"prompt":"\ud83d\u0041"}"#, // high then not low
        r#"{"prompt":"\ude00"}"#,       // lone low
        r#"{"prompt":"\x"}"#,
        r#"{"prompt":"\u12"}"#,
        r#"{"prompt":"\u12g4"}"#,
    ] {
        let (s, _, m) = field_err(body);
        assert_eq!(s, 400, "{body}");
        assert!(m.contains("escape") || m.contains("JSON"), "{body}: {m}");
    }
    for bytes in [
        &b"{\"prompt\":\"\xff\"}"[..],
        b"{\"prompt\":\"\xe4\xb8\"}",             // truncated character
        b"{\"prompt\":\"\xed\xa0\x80\"}",         // encoded surrogate
        b"{\"x\":\"\xc0\xaf\",\"prompt\":\"a\"}", // overlong, in a skipped field
    ] {
        let mut text = [0u8; 64];
        let e = parse_completion(bytes, &mut text).unwrap_err();
        let (s, _, m) = err(e);
        assert_eq!(s, 400);
        assert!(m.starts_with("request body is not valid UTF-8"), "{m}");
    }
}

#[test]
fn invalid_json_is_400() {
    for body in [
        "",
        "   ",
        "{",
        "{\"prompt\":\"x\"",
        "{\"prompt\":\"x\",}",
        "{\"prompt\" \"x\"}",
        "{\"prompt\":\"x\"} x",
        "{\"prompt\":\"x\"}{}",
        "{\"prompt\":\"x\",\"a\":[1,]}",
        "{\"prompt\":\"x\",\"a\":[,1]}",
        "{\"prompt\":\"x\",\"a\":01}",
        "{\"prompt\":\"x\",\"a\":1.}",
        "{\"prompt\":\"x\",\"a\":-}",
        "{\"prompt\":\"x\",\"a\":1e}",
        "{\"prompt\":\"x\",\"a\":tru}",
        "{\"prompt\":\"x\",\"a\":nul}",
        "{\"prompt\":\"x\",\"a\":{1:2}}",
        "{\"prompt\":\"a\nb\"}",
        "{'prompt':'x'}",
    ] {
        let (s, p, m) = field_err(body);
        assert_eq!((s, p), (400, None), "{body:?}");
        assert!(
            m.starts_with("request body is not valid JSON (at byte"),
            "{body:?}: {m}"
        );
    }
    for body in ["[]", "\"x\"", "1", "null"] {
        let (s, _, m) = field_err(body);
        assert_eq!(s, 400);
        assert_eq!(m, "request body must be a JSON object");
    }
    // Deep nesting in a skipped field is refused, not a stack overflow.
    let deep = format!(
        "{{\"prompt\":\"x\",\"a\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let (s, _, m) = field_err(&deep);
    assert_eq!(s, 400);
    assert!(m.contains("nested too deeply"), "{m}");
    let ok = format!(
        "{{\"prompt\":\"x\",\"a\":{}{}}}",
        "[".repeat(64),
        "]".repeat(64)
    );
    completion(&ok).unwrap();
}

#[test]
fn wrong_types_name_the_field() {
    let cases = [
        (r#""model":1"#, "model", "'model' must be a string"),
        (
            r#""prompt":1"#,
            "prompt",
            "'prompt' must be a string or an array of one string",
        ),
        (
            r#""prompt":[1]"#,
            "prompt",
            "'prompt' must be a string or an array of one string",
        ),
        (
            r#""prompt":[]"#,
            "prompt",
            "'prompt' must be a string or an array of one string",
        ),
        (
            r#""prompt":["a","b"]"#,
            "prompt",
            "'prompt' must be a string or an array of one string",
        ),
        (
            r#""max_tokens":"16""#,
            "max_tokens",
            "'max_tokens' must be an integer",
        ),
        (
            r#""max_tokens":16.5"#,
            "max_tokens",
            "'max_tokens' must be an integer",
        ),
        (
            r#""max_tokens":1e3"#,
            "max_tokens",
            "'max_tokens' must be an integer",
        ),
        (
            r#""max_tokens":true"#,
            "max_tokens",
            "'max_tokens' must be an integer",
        ),
        (
            r#""temperature":"hot""#,
            "temperature",
            "'temperature' must be a number",
        ),
        (r#""top_p":[]"#, "top_p", "'top_p' must be a number"),
        (r#""top_k":1.5"#, "top_k", "'top_k' must be an integer"),
        (r#""seed":"1""#, "seed", "'seed' must be an integer"),
        (
            r#""stop":1"#,
            "stop",
            "'stop' must be a string or an array of strings",
        ),
        (
            r#""stop":["a",2]"#,
            "stop",
            "'stop' must be a string or an array of strings",
        ),
        (r#""stream":"yes""#, "stream", "'stream' must be a boolean"),
        (r#""stream":1"#, "stream", "'stream' must be a boolean"),
        (r#""n":"1""#, "n", "'n' must be an integer"),
    ];
    for (field, param, message) in cases {
        let body = format!("{{\"prompt\":\"x\",{field}}}");
        assert_eq!(
            field_err(&body),
            (400, Some(param), message.into()),
            "{body}"
        );
    }
}

#[test]
fn ranges() {
    let limit = MAX_TOKENS_LIMIT;
    let cases = [
        (
            r#""max_tokens":-1"#.to_string(),
            "max_tokens",
            "'max_tokens' must be at least 0".to_string(),
        ),
        (
            format!("\"max_tokens\":{}", limit + 1),
            "max_tokens",
            format!("'max_tokens' must be at most {limit}"),
        ),
        (
            r#""max_tokens":99999999999999999999999999999999999999999999"#.into(),
            "max_tokens",
            format!("'max_tokens' must be at most {limit}"),
        ),
        (
            r#""temperature":-0.1"#.into(),
            "temperature",
            "'temperature' must be between 0 and 2".into(),
        ),
        (
            r#""temperature":2.0001"#.into(),
            "temperature",
            "'temperature' must be between 0 and 2".into(),
        ),
        (
            r#""temperature":1e999"#.into(),
            "temperature",
            "'temperature' must be between 0 and 2".into(),
        ),
        (
            r#""top_p":0"#.into(),
            "top_p",
            "'top_p' must be greater than 0 and at most 1".into(),
        ),
        (
            r#""top_p":1.01"#.into(),
            "top_p",
            "'top_p' must be greater than 0 and at most 1".into(),
        ),
        (
            r#""top_k":-1"#.into(),
            "top_k",
            "'top_k' must be at least 0".into(),
        ),
        (
            r#""n":2"#.into(),
            "n",
            "'n' must be 1 (one choice per request)".into(),
        ),
        (
            r#""n":0"#.into(),
            "n",
            "'n' must be 1 (one choice per request)".into(),
        ),
        (
            r#""seed":18446744073709551616"#.into(),
            "seed",
            "'seed' must be at most 18446744073709551615".into(),
        ),
    ];
    for (field, param, message) in cases {
        let body = format!("{{\"prompt\":\"x\",{field}}}");
        assert_eq!(field_err(&body), (400, Some(param), message), "{body}");
    }
    let ok = |f: &str| {
        completion(&format!("{{\"prompt\":\"x\",{f}}}"))
            .unwrap()
            .params
    };
    assert_eq!(ok(&format!("\"max_tokens\":{limit}")).max_tokens, limit);
    assert_eq!(ok("\"max_tokens\":0").max_tokens, 0);
    assert_eq!(ok("\"max_tokens\":-0").max_tokens, 0);
    assert_eq!(ok("\"temperature\":0").temperature, 0.0);
    assert_eq!(ok("\"temperature\":2").temperature, 2.0);
    assert_eq!(ok("\"top_p\":1").top_p, 1.0);
    assert_eq!(ok("\"top_p\":1e-3").top_p, 0.001);
    assert_eq!(ok("\"seed\":18446744073709551615").seed, Some(u64::MAX));
    assert_eq!(ok("\"seed\":-9223372036854775808").seed, Some(1 << 63));
}

#[test]
fn stops() {
    let stop = |f: &str| completion(&format!("{{\"prompt\":\"x\",\"stop\":{f}}}"));
    assert_eq!(stop(r#""\n""#).unwrap().params.stop.as_slice(), ["\n"]);
    assert_eq!(
        stop(r#"["a","b","c","d"]"#).unwrap().params.stop.as_slice(),
        ["a", "b", "c", "d"]
    );
    assert_eq!(stop("[]").unwrap().params.stop.len(), 0);
    assert_eq!(stop(r#"["","a"]"#).unwrap().params.stop.as_slice(), ["a"]);
    assert_eq!(stop(r#""""#).unwrap().params.stop.len(), 0);
    let (s, p, m) = err(stop(r#"["a","b","c","d","e"]"#).unwrap_err());
    assert_eq!(
        (s, p, m.as_str()),
        (400, Some("stop"), "'stop' may hold at most 4 strings")
    );
    let long = "x".repeat(MAX_STOP_BYTES);
    assert_eq!(stop(&format!("\"{long}\"")).unwrap().params.stop[0], long);
    let too_long = "x".repeat(MAX_STOP_BYTES + 1);
    for f in [format!("\"{too_long}\""), format!("[\"a\",\"{too_long}\"]")] {
        let (s, p, m) = err(stop(&f).unwrap_err());
        assert_eq!(
            (s, p, m.as_str()),
            (
                400,
                Some("stop"),
                "'stop' strings must be at most 128 bytes"
            )
        );
    }
    // 128 bytes after unescaping: 64 two-byte characters written as \u escapes.
    let esc = "\\u00e9".repeat(64);
    assert_eq!(
        stop(&format!("\"{esc}\"")).unwrap().params.stop[0],
        "é".repeat(64)
    );
    // The last duplicate key wins.
    let r = completion(r#"{"prompt":"x","stop":["a","b","c"],"stop":"z"}"#).unwrap();
    assert_eq!(r.params.stop.as_slice(), ["z"]);
}

#[test]
fn prompt_required() {
    for body in ["{}", r#"{"prompt":null}"#, r#"{"model":"m"}"#] {
        assert_eq!(
            field_err(body),
            (400, Some("prompt"), "'prompt' is required".into())
        );
    }
    assert_eq!(completion(r#"{"prompt":""}"#).unwrap().prompt, "");
}

#[test]
fn small_text_buffer_is_413() {
    let body = br#"{"prompt":"hello world"}"#;
    let mut text = [0u8; 10];
    let e = parse_completion(body, &mut text).unwrap_err();
    assert_eq!(e.status, 413);
    let mut text = [0u8; 11];
    assert_eq!(
        parse_completion(body, &mut text).unwrap().prompt,
        "hello world"
    );
}

#[test]
fn chat_requests() {
    let r = chat(
        r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},
            {"role":"user","content":"Hi \"there\"","name":"bob"},
            {"role":"assistant","content":"Hello."},
            {"role":"user","content":[{"type":"text","text":"one"},{"text":"two","type":"text"}]}],
            "max_completion_tokens":7,"temperature":0,"stop":"\n","stream":true}"#,
    )
    .unwrap();
    let m: Vec<(&str, &str)> = r.messages.iter().map(|m| (m.role, m.content)).collect();
    assert_eq!(
        m,
        [
            ("system", "Be brief."),
            ("user", "Hi \"there\""),
            ("assistant", "Hello."),
            ("user", "one\ntwo")
        ]
    );
    assert_eq!(r.model, Some("m"));
    assert_eq!(r.params.max_tokens, 7);
    assert_eq!(r.params.temperature, 0.0);
    assert_eq!(r.params.stop.as_slice(), ["\n"]);
    assert!(r.params.stream);
    let r = chat(r#"{"messages":[{"content":"x","role":"user"}]}"#).unwrap();
    assert_eq!(r.params.max_tokens, MAX_TOKENS_LIMIT);
    assert_eq!(
        r.messages[0],
        ChatMessage {
            role: "user",
            content: "x"
        }
    );
}

#[test]
fn chat_errors() {
    let msgs = |m: &str| format!("{{\"messages\":{m}}}");
    let cases = [
        ("{}".to_string(), "'messages' is required"),
        (
            msgs("null"),
            "'messages' must be an array of message objects",
        ),
        (
            msgs("\"hi\""),
            "'messages' must be an array of message objects",
        ),
        (msgs("[]"), "'messages' must be a non-empty array"),
        (msgs("[1]"), "'messages[0]' must be an object"),
        (
            msgs(r#"[{"role":"user","content":"a"},{"content":"b"}]"#),
            "'messages[1].role' is required",
        ),
        (
            msgs(r#"[{"role":"user"}]"#),
            "'messages[0].content' is required",
        ),
        (
            msgs(r#"[{"role":"tool","content":"a"}]"#),
            "'messages[0].role' must be one of system, developer, user, assistant",
        ),
        (
            msgs(r#"[{"role":"a-very-long-role-name-longer-than-the-scratch","content":"a"}]"#),
            "'messages[0].role' must be one of system, developer, user, assistant",
        ),
        (
            msgs(r#"[{"role":5,"content":"a"}]"#),
            "'messages[0].role' must be one of system, developer, user, assistant",
        ),
        (
            msgs(r#"[{"role":"user","content":null}]"#),
            "'messages[0].content' must be a string or an array of text parts",
        ),
        (
            msgs(r#"[{"role":"user","content":5}]"#),
            "'messages[0].content' must be a string or an array of text parts",
        ),
        (
            msgs(r#"[{"role":"user","content":["a"]}]"#),
            "'messages[0].content' must be a string or an array of text parts",
        ),
        (
            msgs(r#"[{"role":"user","content":[{"text":"a"}]}]"#),
            "'messages[0].content' parts must be of type 'text'",
        ),
        (
            msgs(r#"[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]"#),
            "'messages[0].content' parts must be of type 'text'",
        ),
    ];
    for (body, message) in cases {
        assert_eq!(
            err(chat(&body).unwrap_err()),
            (400, Some("messages"), message.into()),
            "{body}"
        );
    }
    let one = r#"{"role":"user","content":"x"}"#;
    let n = |k: usize| msgs(&format!("[{}]", vec![one; k].join(",")));
    assert_eq!(chat(&n(MAX_MESSAGES)).unwrap().messages.len(), MAX_MESSAGES);
    let (s, p, m) = err(chat(&n(MAX_MESSAGES + 1)).unwrap_err());
    assert_eq!(
        (s, p, m.as_str()),
        (
            400,
            Some("messages"),
            "'messages' may hold at most 32 messages"
        )
    );
    // Sampling fields are checked for chat too.
    let body = format!("{{\"messages\":[{one}],\"max_completion_tokens\":-5}}");
    assert_eq!(
        err(chat(&body).unwrap_err()),
        (
            400,
            Some("max_completion_tokens"),
            "'max_completion_tokens' must be at least 0".into()
        )
    );
}

fn written(f: impl FnOnce(&mut FixedBuf) -> fmt::Result) -> String {
    let mut b = [0u8; 4096];
    let mut w = FixedBuf::new(&mut b);
    f(&mut w).unwrap();
    let s: String = w.as_str().into();
    json::validate(s.as_bytes()).unwrap_or_else(|e| panic!("{e:?}: {s}"));
    s
}

const META: ResponseMeta = ResponseMeta {
    id: 7,
    created: 1700000000,
    model: "qwen\"2",
};
const USAGE: Usage = Usage {
    prompt_tokens: 5,
    completion_tokens: 3,
};

#[test]
fn completion_json() {
    let s = written(|w| {
        write_completion(
            w,
            &META,
            b"Hi \"you\"\n\x01\xff",
            FinishReason::Length,
            &USAGE,
        )
    });
    assert_eq!(
        s,
        "{\"id\":\"cmpl-7\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"qwen\\\"2\",\
         \"choices\":[{\"index\":0,\"text\":\"Hi \\\"you\\\"\\n\\u0001\u{FFFD}\",\"finish_reason\":\"length\",\
         \"logprobs\":null}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}"
    );
    // The text round-trips through the reader.
    let mut text = [0u8; 64];
    let mut sink = json::Sink::new(&mut text, 0);
    let at = s.find("\"text\":").unwrap() + 7;
    json::Reader::new(&s.as_bytes()[at..])
        .string(Some(&mut sink))
        .unwrap();
    assert_eq!(sink.as_str(), Some("Hi \"you\"\n\u{1}\u{FFFD}"));
}

#[test]
fn chat_json() {
    let s =
        written(|w| write_chat_completion(w, &META, "é\t".as_bytes(), FinishReason::Stop, &USAGE));
    assert_eq!(
        s,
        "{\"id\":\"chatcmpl-7\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"qwen\\\"2\",\
         \"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"é\\t\"},\
         \"finish_reason\":\"stop\",\"logprobs\":null}],\"usage\":{\"prompt_tokens\":5,\
         \"completion_tokens\":3,\"total_tokens\":8}}"
    );
}

#[test]
fn streaming_chunks() {
    let mut carry = Utf8Carry::new();
    let euro = "€".as_bytes();
    let s = written(|w| write_completion_chunk(w, &META, &mut carry, &[b'a', euro[0]]));
    assert!(s.contains("\"text\":\"a\",\"finish_reason\":null"), "{s}");
    assert!(s.contains("\"object\":\"text_completion\""));
    let s = written(|w| write_completion_chunk(w, &META, &mut carry, &euro[1..]));
    assert!(s.contains("\"text\":\"€\""), "{s}");
    let s = written(|w| write_completion_chunk(w, &META, &mut carry, &euro[..2]));
    assert!(s.contains("\"text\":\"\""), "{s}");
    let s = written(|w| {
        write_completion_final_chunk(w, &META, &mut carry, FinishReason::Length, Some(&USAGE))
    });
    assert!(
        s.contains("\"text\":\"\u{FFFD}\",\"finish_reason\":\"length\""),
        "{s}"
    );
    assert!(s.ends_with("\"total_tokens\":8}}"), "{s}");
    let s =
        written(|w| write_completion_final_chunk(w, &META, &mut carry, FinishReason::Stop, None));
    assert!(
        s.ends_with("\"text\":\"\",\"finish_reason\":\"stop\",\"logprobs\":null}]}"),
        "{s}"
    );

    let s = written(|w| write_chat_role_chunk(w, &META));
    assert!(s.contains("\"object\":\"chat.completion.chunk\""));
    assert!(
        s.contains("\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"),
        "{s}"
    );
    let s = written(|w| write_chat_chunk(w, &META, &mut carry, b"x\n"));
    assert!(
        s.contains("\"delta\":{\"content\":\"x\\n\"},\"finish_reason\":null"),
        "{s}"
    );
    let s =
        written(|w| write_chat_final_chunk(w, &META, &mut carry, FinishReason::Stop, Some(&USAGE)));
    assert!(s.contains("\"delta\":{},\"finish_reason\":\"stop\""), "{s}");
    assert!(s.contains("\"usage\":{"));
    let s = written(|w| write_chat_chunk(w, &META, &mut carry, &euro[..1]));
    assert!(s.contains("\"delta\":{\"content\":\"\"}"), "{s}");
    let s =
        written(|w| write_chat_final_chunk(w, &META, &mut carry, FinishReason::Cancelled, None));
    assert!(
        s.contains("\"delta\":{\"content\":\"\u{FFFD}\"},\"finish_reason\":\"stop\""),
        "{s}"
    );
}

#[test]
fn models_health_errors() {
    let s = written(|w| write_models(w, "qwen2.5-0.5b", 1700000000));
    assert_eq!(
        s,
        "{\"object\":\"list\",\"data\":[{\"id\":\"qwen2.5-0.5b\",\"object\":\"model\",\
         \"created\":1700000000,\"owned_by\":\"leanstream\"}]}"
    );
    let s = written(|w| write_health(w, "m", false));
    assert_eq!(s, "{\"status\":\"ok\",\"model\":\"m\"}");
    let s = written(|w| write_health(w, "m", true));
    assert_eq!(s, "{\"status\":\"stalled\",\"model\":\"m\"}");
    let e = ApiError::invalid(
        "max_tokens",
        format_args!("'max_tokens' must be an integer"),
    );
    assert_eq!(
        written(|w| write_error(w, &e)),
        "{\"error\":{\"message\":\"'max_tokens' must be an integer\",\"type\":\"invalid_request_error\",\
         \"param\":\"max_tokens\",\"code\":null}}"
    );
    let e = ApiError::queue_full();
    assert_eq!(
        written(|w| write_error(w, &e)),
        "{\"error\":{\"message\":\"the request queue is full; retry shortly\",\"type\":\"server_error\",\
         \"param\":null,\"code\":null}}"
    );
    // A message at its 256-byte cap, all control characters, still fits ERROR_BODY_MAX.
    let ctl = "\u{1}".repeat(400);
    let e = ApiError::server_error(&ctl);
    assert_eq!(e.message.len(), 256);
    assert_eq!(err(e).0, 500);
    assert_eq!(err(ApiError::forbidden()).0, 403);
}

#[test]
fn unsupported_openai_fields_are_400_naming_the_field() {
    for (field, value) in [
        ("echo", "true"),
        ("logprobs", "5"),
        ("logprobs", "true"),
        ("top_logprobs", "3"),
        ("best_of", "3"),
        ("suffix", "\"end\""),
        ("response_format", r#"{"type":"json_object"}"#),
        ("tools", r#"[{"type":"function","function":{"name":"f"}}]"#),
        ("tool_choice", "\"auto\""),
        ("functions", r#"[{"name":"f"}]"#),
        ("function_call", "\"auto\""),
        ("logit_bias", r#"{"50256":-100}"#),
    ] {
        let body = format!(r#"{{"prompt":"x","{field}":{value}}}"#);
        let (status, param, message) = field_err(&body);
        assert_eq!((status, param), (400, Some(field)), "{body}");
        assert_eq!(
            message,
            format!("'{field}' is not supported by this server")
        );
        let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"{field}":{value}}}"#);
        let (status, param, _) = err(chat(&body).unwrap_err());
        assert_eq!((status, param), (400, Some(field)), "{body}");
    }
    // Their "off" values are accepted as no-ops.
    let r = completion(
        r#"{"prompt":"x","echo":false,"logprobs":null,"top_logprobs":0,"best_of":1,
           "suffix":"","response_format":{"type":"text"},"tools":[],"tool_choice":"none",
           "functions":[],"function_call":"none","logit_bias":{}}"#,
    )
    .unwrap();
    assert_eq!(r.params, Params::with_max_tokens(16));
    chat(r#"{"messages":[{"role":"user","content":"x"}],"logprobs":false,"tools":null}"#).unwrap();
}

#[test]
fn developer_role_is_system() {
    let r = chat(
        r#"{"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}]}"#,
    )
    .unwrap();
    assert_eq!(r.messages[0].role, "system");
    assert_eq!(r.messages[0].content, "Be brief.");
    assert_eq!(r.messages[1].role, "user");
}

#[test]
fn streamed_whole_responses_equal_the_one_piece_writers() {
    let meta = ResponseMeta {
        id: 7,
        created: 1,
        model: "m",
    };
    let usage = Usage {
        prompt_tokens: 2,
        completion_tokens: 3,
    };
    // Pieces that split a character, and a quote and a newline that need escaping.
    let pieces: [&[u8]; 4] = [b"a\"b\n", b"\xe4\xb8", b"\xad ok", b"\xff"];
    let whole: Vec<u8> = pieces.concat();
    for chat in [false, true] {
        let one = written(|w| {
            if chat {
                write_chat_completion(w, &meta, &whole, FinishReason::Length, &usage)
            } else {
                write_completion(w, &meta, &whole, FinishReason::Length, &usage)
            }
        });
        let streamed = written(|w| {
            let mut carry = Utf8Carry::new();
            if chat {
                write_chat_completion_open(w, &meta)?;
            } else {
                write_completion_open(w, &meta)?;
            }
            for p in pieces {
                carry.push(p, w)?;
            }
            if chat {
                write_chat_completion_close(w, &mut carry, FinishReason::Length, &usage, None)
            } else {
                write_completion_close(w, &mut carry, FinishReason::Length, &usage, None)
            }
        });
        assert_eq!(one, streamed);
        json::validate(one.as_bytes()).unwrap();
        assert!(one.contains("a\\\"b\\n中 ok\u{fffd}"), "{one}");
    }
}

/// An answer whose engine failed midway ends as valid JSON with finish_reason "error" and the
/// error beside the usage.
#[test]
fn an_answer_cut_by_an_engine_error_is_valid_json_naming_it() {
    let usage = Usage {
        prompt_tokens: 3,
        completion_tokens: 2,
    };
    let e = ApiError::new(500, None, format_args!("the FFN stream failed: EIO"));
    for chat in [false, true] {
        let out = written(|w| {
            let mut carry = Utf8Carry::new();
            if chat {
                write_chat_completion_open(w, &META)?;
                carry.push(b"so far", w)?;
                write_chat_completion_close(w, &mut carry, FinishReason::Error, &usage, Some(&e))
            } else {
                write_completion_open(w, &META)?;
                carry.push(b"so far", w)?;
                write_completion_close(w, &mut carry, FinishReason::Error, &usage, Some(&e))
            }
        });
        json::validate(out.as_bytes()).unwrap();
        assert!(
            out.contains("so far")
                && out.contains("\"finish_reason\":\"error\"")
                && out.ends_with(
                    ",\"error\":{\"message\":\"the FFN stream failed: EIO\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"
                ),
            "{out}"
        );
    }
}
