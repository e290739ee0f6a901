use super::*;
use std::io::{Cursor, Read};
use std::os::unix::net::UnixListener;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// A fake daemon: for each canned response, accepts one connection, reads the
/// request (head + Content-Length body), sends the request text back on the
/// channel and writes the response in `piece`-byte writes with small pauses,
/// so the client sees arbitrary read boundaries.
struct FakeDaemon {
    _dir: tempfile::TempDir,
    path: PathBuf,
    requests: mpsc::Receiver<String>,
    handle: thread::JoinHandle<()>,
}

fn fake_daemon(responses: Vec<Vec<u8>>, piece: usize) -> FakeDaemon {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        for resp in responses {
            let (mut s, _) = listener.accept().unwrap();
            tx.send(read_request(&mut s)).unwrap();
            for chunk in resp.chunks(piece) {
                // The client may hang up once it has what it needs (after
                // `[DONE]`, before the chunked trailer): stop writing then.
                if s.write_all(chunk).and_then(|()| s.flush()).is_err() {
                    break;
                }
                if piece < 16 {
                    thread::sleep(Duration::from_micros(200));
                }
            }
        }
    });
    FakeDaemon {
        _dir: dir,
        path,
        requests: rx,
        handle,
    }
}

fn read_request(s: &mut UnixStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).unwrap() == 0 {
            break;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map(|v| v.trim().parse::<usize>().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head + &String::from_utf8(body).unwrap()
}

fn sse_response(events: &[&str]) -> Vec<u8> {
    let mut r =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n".to_vec();
    for e in events {
        r.extend_from_slice(format!("data: {e}\n\n").as_bytes());
    }
    r.extend_from_slice(b"data: [DONE]\n\n");
    r
}

fn json_response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn body_json(request: &str) -> Value {
    serde_json::from_str(request.split("\r\n\r\n").nth(1).unwrap()).unwrap()
}

const COMPLETION_EVENTS: &[&str] = &[
    r#"{"id":"c1","object":"text_completion","choices":[{"index":0,"text":"Hello","finish_reason":null}]}"#,
    r#"{"id":"c1","object":"text_completion","choices":[{"index":0,"text":", wörld \"ok\"","finish_reason":null}]}"#,
    r#"{"id":"c1","object":"text_completion","choices":[{"index":0,"text":"!","finish_reason":"length"}]}"#,
    r#"{"id":"c1","object":"text_completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#,
];

#[test]
fn ask_streams_completion_split_across_reads() {
    for piece in [1, 3, 7, 4096] {
        let d = fake_daemon(vec![sse_response(COMPLETION_EVENTS)], piece);
        let opts = AskOptions {
            max_tokens: Some(3),
            temperature: Some(0.5),
            seed: Some(42),
            ..Default::default()
        };
        let mut out = Vec::new();
        let summary = ask(&d.path, "Say \"hi\"\n\tnow", &opts, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "Hello, wörld \"ok\"!");
        assert_eq!(
            summary,
            AskSummary {
                finish_reason: Some("length".into()),
                prompt_tokens: Some(5),
                completion_tokens: 3,
                usage_reported: true,
            }
        );
        let req = d.requests.recv().unwrap();
        assert!(
            req.starts_with("POST /v1/completions HTTP/1.1\r\n"),
            "{req}"
        );
        let body = body_json(&req);
        assert_eq!(body["prompt"], "Say \"hi\"\n\tnow");
        assert_eq!(body["stream"], true);
        assert_eq!(body["max_tokens"], 3);
        assert_eq!(body["temperature"], 0.5);
        assert_eq!(body["seed"], 42);
        assert!(body.get("top_k").is_none());
        d.handle.join().unwrap();
    }
}

/// Each piece is written and flushed as it arrives, before the stream ends.
#[test]
fn ask_writes_pieces_before_the_stream_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        read_request(&mut s);
        s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: {\"choices\":[{\"text\":\"first\"}]}\n\n")
            .unwrap();
        go_rx.recv().unwrap(); // wait until the client has shown "first"
        s.write_all(b"data: {\"choices\":[{\"text\":\" second\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
            .unwrap();
    });
    struct Probe(Vec<u8>, Option<mpsc::Sender<()>>);
    impl Write for Probe {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            if self.0 == b"first" {
                if let Some(tx) = self.1.take() {
                    tx.send(()).unwrap();
                }
            }
            Ok(())
        }
    }
    let mut probe = Probe(Vec::new(), Some(go_tx));
    let s = ask(&path, "x", &AskOptions::default(), &mut probe).unwrap();
    assert_eq!(probe.0, b"first second");
    assert_eq!(s.finish_reason.as_deref(), Some("stop"));
    assert_eq!(s.completion_tokens, 2);
    assert!(!s.usage_reported);
    server.join().unwrap();
}

#[test]
fn ask_chat_uses_delta_content_and_chunked_encoding() {
    let events = [
        r#"{"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"Bon"},"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"jour"},"finish_reason":"stop"}]}"#,
    ];
    let plain = sse_response(&events);
    let split = plain.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let (head, body) = plain.split_at(split);
    let mut resp = String::from_utf8(head.to_vec())
        .unwrap()
        .replace(
            "Connection: close\r\n",
            "Connection: close\r\nTransfer-Encoding: chunked\r\n",
        )
        .into_bytes();
    for c in body.chunks(11) {
        resp.extend_from_slice(format!("{:x};ext=1\r\n", c.len()).as_bytes());
        resp.extend_from_slice(c);
        resp.extend_from_slice(b"\r\n");
    }
    resp.extend_from_slice(b"0\r\n\r\n");
    let d = fake_daemon(vec![resp], 5);
    let opts = AskOptions {
        chat: true,
        top_k: Some(40),
        top_p: Some(0.9),
        ..Default::default()
    };
    let mut out = Vec::new();
    let s = ask(&d.path, "Hello", &opts, &mut out).unwrap();
    assert_eq!(out, b"Bonjour");
    assert_eq!(s.finish_reason.as_deref(), Some("stop"));
    assert_eq!(s.completion_tokens, 2);
    let req = d.requests.recv().unwrap();
    assert!(req.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"));
    let body = body_json(&req);
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "Hello"}])
    );
    assert_eq!(body["top_k"], 40);
    assert_eq!(body["top_p"].to_string(), "0.9");
    assert!(body.get("prompt").is_none());
    d.handle.join().unwrap();
}

#[test]
fn server_error_503_becomes_client_error() {
    let d = fake_daemon(
        vec![json_response(
            "503 Service Unavailable",
            r#"{"error":{"message":"busy: 4 clients connected (max 4)","type":"server_error"}}"#,
        )],
        2,
    );
    let err = ask(&d.path, "x", &AskOptions::default(), &mut Vec::new()).unwrap_err();
    match &err {
        ClientError::Server { status, message } => {
            assert_eq!(*status, 503);
            assert_eq!(message, "busy: 4 clients connected (max 4)");
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(
        err.to_string(),
        "leanstreamd refused the request (HTTP 503): busy: 4 clients connected (max 4)"
    );
    d.handle.join().unwrap();
}

#[test]
fn error_inside_the_stream_and_truncated_stream() {
    let mid = b"HTTP/1.1 200 OK\r\n\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"shutting down\"}}\n\n".to_vec();
    let cut = b"HTTP/1.1 200 OK\r\n\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\n".to_vec();
    let d = fake_daemon(vec![mid, cut], 4096);
    let err = ask(&d.path, "x", &AskOptions::default(), &mut Vec::new()).unwrap_err();
    assert!(
        matches!(&err, ClientError::Server { status: 200, message } if message == "shutting down"),
        "{err:?}"
    );
    let err = ask(&d.path, "x", &AskOptions::default(), &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
    assert!(err.to_string().contains("[DONE]"));
    d.handle.join().unwrap();
}

#[test]
fn missing_socket_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = ask(&path, "x", &AskOptions::default(), &mut Vec::new()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("is leanstreamd running?"), "{msg}");
    // A stale socket file nobody listens on: connection refused.
    drop(UnixListener::bind(&path).unwrap());
    let msg = status(&path, &mut Vec::new()).unwrap_err().to_string();
    assert!(msg.starts_with("nothing is listening on "), "{msg}");
}

#[test]
fn chat_repl_keeps_history() {
    let d = fake_daemon(
        vec![
            sse_response(&[
                r#"{"choices":[{"delta":{"content":"Hi Ann."},"finish_reason":"stop"}]}"#,
            ]),
            json_response(
                "400 Bad Request",
                r#"{"error":{"message":"prompt too long"}}"#,
            ),
            sse_response(&[r#"{"choices":[{"delta":{"content":"Ann."},"finish_reason":"stop"}]}"#]),
        ],
        4096,
    );
    let mut input = Cursor::new("I am Ann\n\nlong one\nWho am I?\n/exit\nnever sent\n");
    let mut out = Vec::new();
    chat_repl(&d.path, &AskOptions::default(), &mut input, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text,
        "> Hi Ann.\n> > \nerror: leanstreamd refused the request (HTTP 400): prompt too long\n> Ann.\n> "
    );
    let r1 = body_json(&d.requests.recv().unwrap());
    assert_eq!(
        r1["messages"],
        json!([{"role": "user", "content": "I am Ann"}])
    );
    let _r2 = d.requests.recv().unwrap();
    let r3 = body_json(&d.requests.recv().unwrap());
    assert_eq!(
        r3["messages"],
        json!([
            {"role": "user", "content": "I am Ann"},
            {"role": "assistant", "content": "Hi Ann."},
            {"role": "user", "content": "Who am I?"},
        ])
    );
    d.handle.join().unwrap();
}

#[test]
fn chat_repl_ends_at_eof() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    let path = dir.path().join("unused.sock");
    chat_repl(
        &path,
        &AskOptions::default(),
        &mut Cursor::new(""),
        &mut out,
    )
    .unwrap();
    assert_eq!(out, b"> \n");
}

#[test]
fn status_prints_health_and_metrics() {
    let metrics = "# HELP leanstream_requests_total Requests served.\n# TYPE leanstream_requests_total counter\nleanstream_requests_total 12\nleanstream_tokens_per_second{phase=\"decode\"} 18.5\n";
    let d = fake_daemon(
        vec![
            json_response("200 OK", r#"{"status":"ok","model":"tiny.gguf"}"#),
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n{metrics}"
            )
            .into_bytes(),
        ],
        6,
    );
    let mut out = Vec::new();
    status(&d.path, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let expected = format!(
        "daemon:  {} (HTTP 200)\n  model: tiny.gguf\n  status: ok\nmetrics:\n  leanstream_requests_total                     12\n  leanstream_tokens_per_second{{phase=\"decode\"}}  18.5\n",
        d.path.display()
    );
    assert_eq!(text, expected);
    assert!(d
        .requests
        .recv()
        .unwrap()
        .starts_with("GET /health HTTP/1.1\r\n"));
    assert!(d
        .requests
        .recv()
        .unwrap()
        .starts_with("GET /metrics HTTP/1.1\r\n"));
    d.handle.join().unwrap();
}

#[test]
fn status_reports_unhealthy() {
    let d = fake_daemon(
        vec![json_response(
            "503 Service Unavailable",
            r#"{"error":{"message":"loading model"}}"#,
        )],
        4096,
    );
    let mut out = Vec::new();
    let err = status(&d.path, &mut out).unwrap_err();
    assert!(matches!(err, ClientError::Server { status: 503, .. }));
    assert!(String::from_utf8(out).unwrap().contains("(HTTP 503)"));
    d.handle.join().unwrap();
}

#[test]
fn sse_reader_handles_one_byte_reads_and_multiline_data() {
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
    let src =
        b": comment\r\nevent: x\r\ndata: a\r\ndata:b\r\n\r\n\n\ndata: {\"k\":1}\n\ndata: tail";
    let mut r = SseReader::new(Trickle(src));
    assert_eq!(r.next_data().unwrap().as_deref(), Some("a\nb"));
    assert_eq!(r.next_data().unwrap().as_deref(), Some("{\"k\":1}"));
    assert_eq!(r.next_data().unwrap().as_deref(), Some("tail"));
    assert_eq!(r.next_data().unwrap(), None);
}
