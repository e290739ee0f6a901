//! The CLI's client for `leanstreamd`: HTTP/1.1 over the daemon's Unix socket,
//! one request per connection (the daemon answers `Connection: close`).
//!
//! - [`ask`]: one completion (or one-message chat), streamed to a writer.
//! - [`chat_repl`]: an interactive chat keeping the message history.
//! - [`status`]: `/health` and `/metrics`, printed readably.
//!
//! Unlike the daemon, this side may allocate. JSON goes through `serde_json`.

mod http;
mod sse;

use std::fmt;
use std::io::{self, BufRead, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

pub use http::Response;
pub use sse::SseReader;

/// Generation settings; `None` leaves the daemon's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AskOptions {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    /// `POST /v1/chat/completions` with the prompt as one user message,
    /// instead of `POST /v1/completions` with a raw prompt.
    pub chat: bool,
}

/// How a streamed answer ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AskSummary {
    /// `"stop"`, `"length"`, ... as the daemon sent it; `None` if it sent none.
    pub finish_reason: Option<String>,
    /// From the daemon's `usage`, when it sent one.
    pub prompt_tokens: Option<u64>,
    /// From `usage` when sent, otherwise the number of streamed text pieces
    /// (the daemon sends one per token).
    pub completion_tokens: u64,
    /// Whether the counts came from the daemon's `usage` object.
    pub usage_reported: bool,
}

/// Everything that can go wrong talking to the daemon.
#[derive(Debug)]
pub enum ClientError {
    /// Could not connect to the socket.
    Connect { path: PathBuf, source: io::Error },
    /// The connection or the output writer failed.
    Io(io::Error),
    /// The daemon answered something that is not the expected HTTP/SSE/JSON.
    Protocol(String),
    /// The daemon answered with an error (`{"error":{"message":...}}`).
    Server { status: u16, message: String },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Connect { path, source } => {
                let p = path.display();
                match source.kind() {
                    io::ErrorKind::NotFound => {
                        write!(f, "no socket at {p}: is leanstreamd running?")
                    }
                    io::ErrorKind::ConnectionRefused => {
                        write!(f, "nothing is listening on {p}: is leanstreamd running?")
                    }
                    io::ErrorKind::PermissionDenied => write!(
                        f,
                        "permission denied connecting to {p}: is your user in the daemon's group?"
                    ),
                    _ => write!(
                        f,
                        "cannot connect to {p} ({source}): is leanstreamd running?"
                    ),
                }
            }
            ClientError::Io(e) => write!(f, "i/o error talking to leanstreamd: {e}"),
            ClientError::Protocol(m) => write!(f, "unexpected answer from leanstreamd: {m}"),
            ClientError::Server { status, message } => {
                write!(
                    f,
                    "leanstreamd refused the request (HTTP {status}): {message}"
                )
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Connect { source, .. } | ClientError::Io(source) => Some(source),
            _ => None,
        }
    }
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

fn connect(socket: &Path) -> Result<UnixStream, ClientError> {
    UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: socket.to_path_buf(),
        source,
    })
}

/// Sends one request and returns the response with its head parsed and the
/// body ready to read. Error statuses (>= 400) become [`ClientError::Server`].
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Response<UnixStream>, ClientError> {
    let mut stream = connect(socket)?;
    http::write_request(&mut stream, method, path, body)?;
    let resp = http::read_response(stream)?;
    if resp.status >= 400 {
        return Err(resp.into_error());
    }
    Ok(resp)
}

/// The JSON body of a streaming completion (or chat) request.
pub fn request_body(prompt_or_messages: &Value, opts: &AskOptions) -> String {
    let mut body = serde_json::Map::new();
    if opts.chat {
        body.insert("messages".into(), prompt_or_messages.clone());
    } else {
        body.insert("prompt".into(), prompt_or_messages.clone());
    }
    if let Some(v) = opts.max_tokens {
        body.insert("max_tokens".into(), v.into());
    }
    if let Some(v) = opts.temperature {
        body.insert("temperature".into(), f32_json(v));
    }
    if let Some(v) = opts.top_p {
        body.insert("top_p".into(), f32_json(v));
    }
    if let Some(v) = opts.top_k {
        body.insert("top_k".into(), v.into());
    }
    if let Some(v) = opts.seed {
        body.insert("seed".into(), v.into());
    }
    body.insert("stream".into(), true.into());
    body.insert("stream_options".into(), json!({ "include_usage": true }));
    Value::Object(body).to_string()
}

/// An `f32` as the JSON number with its shortest decimal form (`0.9`, not
/// `0.8999999761581421`); `null` if not finite.
fn f32_json(v: f32) -> Value {
    v.to_string()
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map_or(Value::Null, Value::from)
}

/// Sends `prompt` and streams the answer into `out` as it arrives (each piece
/// written and flushed immediately). With `opts.chat` the prompt is one user
/// message to `/v1/chat/completions`; otherwise a raw `/v1/completions` prompt.
pub fn ask(
    socket: &Path,
    prompt: &str,
    opts: &AskOptions,
    out: &mut dyn Write,
) -> Result<AskSummary, ClientError> {
    let input = if opts.chat {
        json!([{ "role": "user", "content": prompt }])
    } else {
        Value::String(prompt.to_owned())
    };
    stream_completion(socket, &input, opts, out, &mut |_| {})
}

/// POSTs a streaming request and feeds each text piece to `out` and `piece`.
fn stream_completion(
    socket: &Path,
    input: &Value,
    opts: &AskOptions,
    out: &mut dyn Write,
    piece: &mut dyn FnMut(&str),
) -> Result<AskSummary, ClientError> {
    let path = if opts.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let body = request_body(input, opts);
    let resp = request(socket, "POST", path, Some(&body))?;
    let status = resp.status;
    let mut events = SseReader::new(resp.into_body());
    let mut summary = AskSummary::default();
    let mut pieces = 0u64;
    let mut done = false;
    while let Some(data) = events.next_data()? {
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(&data)
            .map_err(|e| ClientError::Protocol(format!("bad JSON in event ({e}): {data}")))?;
        if let Some(err) = v.get("error") {
            return Err(ClientError::Server {
                status,
                message: error_message(err),
            });
        }
        if let Some(choice) = v.get("choices").and_then(|c| c.get(0)) {
            let text = if opts.chat {
                choice.pointer("/delta/content").and_then(Value::as_str)
            } else {
                choice.get("text").and_then(Value::as_str)
            };
            if let Some(text) = text.filter(|t| !t.is_empty()) {
                out.write_all(text.as_bytes())?;
                out.flush()?;
                piece(text);
                pieces += 1;
            }
            if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
                summary.finish_reason = Some(r.to_owned());
            }
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            summary.prompt_tokens = usage.get("prompt_tokens").and_then(Value::as_u64);
            if let Some(n) = usage.get("completion_tokens").and_then(Value::as_u64) {
                summary.completion_tokens = n;
                summary.usage_reported = true;
            }
        }
    }
    if !done {
        return Err(ClientError::Protocol(
            "the stream ended before `data: [DONE]` (daemon stopped?)".into(),
        ));
    }
    if !summary.usage_reported {
        summary.completion_tokens = pieces;
    }
    Ok(summary)
}

/// `{"message": ...}` of an error object, or the object itself as text.
fn error_message(err: &Value) -> String {
    match err.get("message").and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None => match err.as_str() {
            Some(s) => s.to_owned(),
            None => err.to_string(),
        },
    }
}

/// An interactive chat: reads one user line at a time from `input` (prompting
/// with `> ` on `out`), streams each answer and keeps the whole history in
/// the following requests (`opts.chat` is implied). `/exit` or end of input
/// ends it; `/reset` forgets the history. An error the daemon reports for
/// one turn is printed and that turn is dropped; a lost connection ends the
/// session with the error.
pub fn chat_repl(
    socket: &Path,
    opts: &AskOptions,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), ClientError> {
    let opts = AskOptions {
        chat: true,
        ..opts.clone()
    };
    let mut history: Vec<Value> = Vec::new();
    let mut line = String::new();
    loop {
        out.write_all(b"> ")?;
        out.flush()?;
        line.clear();
        if input.read_line(&mut line)? == 0 {
            out.write_all(b"\n")?;
            return Ok(());
        }
        let msg = line.trim_end_matches(['\n', '\r']);
        match msg.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                history.clear();
                writeln!(out, "(history cleared)")?;
                continue;
            }
            _ => {}
        }
        history.push(json!({ "role": "user", "content": msg }));
        let mut answer = String::new();
        let result = stream_completion(
            socket,
            &Value::Array(history.clone()),
            &opts,
            out,
            &mut |p| answer.push_str(p),
        );
        match result {
            Ok(_) => {
                writeln!(out)?;
                history.push(json!({ "role": "assistant", "content": answer }));
            }
            Err(e @ (ClientError::Server { .. } | ClientError::Protocol(_))) => {
                writeln!(out, "\nerror: {e}")?;
                history.pop();
            }
            Err(e) => return Err(e),
        }
    }
}

/// Prints the daemon's `/health` and `/metrics` readably. Returns
/// [`ClientError::Server`] (after printing) if the daemon reports unhealthy.
pub fn status(socket: &Path, out: &mut dyn Write) -> Result<(), ClientError> {
    let mut stream = connect(socket)?;
    http::write_request(&mut stream, "GET", "/health", None)?;
    let health = http::read_response(stream)?;
    let health_status = health.status;
    let health_body = health.read_body_to_string()?;
    writeln!(out, "daemon:  {} (HTTP {health_status})", socket.display())?;
    match serde_json::from_str::<Value>(&health_body) {
        Ok(Value::Object(map)) => {
            for (k, v) in &map {
                let v = match v {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                writeln!(out, "  {k}: {v}")?;
            }
        }
        _ => writeln!(out, "  {}", health_body.trim())?,
    }
    if health_status >= 400 {
        let message = serde_json::from_str::<Value>(&health_body)
            .ok()
            .and_then(|v| v.get("error").map(error_message))
            .unwrap_or_else(|| health_body.trim().to_owned());
        return Err(ClientError::Server {
            status: health_status,
            message,
        });
    }
    let metrics = request(socket, "GET", "/metrics", None)?.read_body_to_string()?;
    writeln!(out, "metrics:")?;
    write_metrics(&metrics, out)?;
    Ok(())
}

/// Prometheus text without `# HELP`/`# TYPE` lines, names padded into a column.
fn write_metrics(text: &str, out: &mut dyn Write) -> io::Result<()> {
    let samples: Vec<(&str, &str)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            // `name{label="a b"} value [timestamp]`: labels may hold spaces.
            let name_end = match (l.find('{'), l.rfind('}')) {
                (Some(_), Some(close)) => close + 1,
                _ => l.find([' ', '\t']).unwrap_or(l.len()),
            };
            (&l[..name_end], l[name_end..].trim())
        })
        .collect();
    let width = samples.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, value) in samples {
        writeln!(out, "  {name:<width$}  {value}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
