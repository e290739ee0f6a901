//! leanstreamd as a child process over its Unix socket, for the daemon tests: start it, send
//! raw requests, read whole responses, pick fields out of JSON and event streams.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
}

pub fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ls-{}-{tag}.sock", std::process::id()))
}

impl Daemon {
    pub fn start(model: &Path, tokenizer: Option<&Path>, tag: &str, extra: &[&str]) -> Daemon {
        Self::start_env(model, tokenizer, tag, extra, &[])
    }

    pub fn start_env(
        model: &Path,
        tokenizer: Option<&Path>,
        tag: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let socket = socket_path(tag);
        let mut cmd = Command::new(super::leanstreamd());
        cmd.envs(env.iter().copied());
        cmd.arg("--model").arg(model).arg("--socket").arg(&socket);
        if let Some(t) = tokenizer {
            cmd.arg("--tokenizer").arg(t);
        }
        cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::null());
        let child = cmd.spawn().expect("start leanstreamd");
        let started = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "leanstreamd did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // A probe connection with no request: the daemon answers it 408 later; ready now.
        Daemon { child, socket }
    }

    pub fn stories() -> Option<Daemon> {
        Self::stories_with("stories", &[])
    }

    pub fn stories_with(tag: &str, extra: &[&str]) -> Option<Daemon> {
        let model = super::shared("data/stories260K/stories260K.bin")?;
        let tok = super::shared("data/stories260K/tok512.bin")?;
        Some(Daemon::start(&model, Some(&tok), tag, extra))
    }

    /// Sends raw bytes, reads the whole response (the daemon closes each connection).
    pub fn raw(&self, bytes: &[u8]) -> Response {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let _ = s.write_all(bytes);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        Response::parse(&out)
    }

    pub fn get(&self, path: &str) -> Response {
        self.raw(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        self.raw(
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                .as_bytes(),
        )
    }

    /// SIGTERM, then the exit code.
    pub fn stop(mut self) -> i32 {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "leanstreamd did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Response {
    pub fn parse(raw: &[u8]) -> Response {
        let text = String::from_utf8_lossy(raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Response {
            status,
            head: head.to_string(),
            body: body.to_string(),
        }
    }

    /// The JSON string value of `"key":"..."` (first occurrence), unescaped enough for tests.
    pub fn field(&self, key: &str) -> Option<String> {
        json_string_field(&self.body, key)
    }
}

pub fn json_string_field(json: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = json.find(&pat)? + pat.len();
    let mut out = String::new();
    let mut chars = json[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?).unwrap_or('?'));
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Concatenated text of an SSE stream, and whether it ended with [DONE].
pub fn sse_text(body: &str, key: &str) -> (String, bool) {
    let mut text = String::new();
    let mut done = false;
    for line in body.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            if data == "[DONE]" {
                done = true;
            } else if let Some(t) = json_string_field(data, key) {
                text.push_str(&t);
            }
        }
    }
    (text, done)
}

pub fn metric(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The CLI's greedy text after `prompt` (`leanstream generate`, `extra` flags added).
pub fn cli_greedy(model: &Path, tokenizer: Option<&Path>, prompt: &str, n: usize) -> String {
    cli_greedy_with(model, tokenizer, prompt, n, &[])
}

pub fn cli_greedy_with(
    model: &Path,
    tokenizer: Option<&Path>,
    prompt: &str,
    n: usize,
    extra: &[&str],
) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leanstream"));
    cmd.args(["generate", "--model"]).arg(model).args([
        "--prompt",
        prompt,
        "--max-tokens",
        &n.to_string(),
    ]);
    if let Some(t) = tokenizer {
        cmd.arg("--tokenizer").arg(t);
    }
    cmd.args(extra);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut s = String::from_utf8(out.stdout).unwrap();
    assert_eq!(s.pop(), Some('\n'));
    s
}
