//! Chat prompt formats, detected from the GGUF `tokenizer.chat_template` (Jinja) text by its markers
//! and rendered by hand (no Jinja engine). The renderings reproduce what the templates of the
//! supported models produce, including the default system prompt some of them inject.

use std::fmt;

use super::TokenizerError;

/// One chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatMessage<'a> {
    /// `system`, `user`, `assistant` (or `tool` for ChatML).
    pub role: &'a str,
    pub content: &'a str,
}

/// A supported chat prompt format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatFormat {
    /// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message; generation prompt
    /// `<|im_start|>assistant\n`. `default_system` is injected as a first system message when the
    /// conversation does not start with one (Qwen2.5: "You are Qwen, created by Alibaba Cloud. You
    /// are a helpful assistant."; SmolLM2: "You are a helpful AI assistant named SmolLM, trained by
    /// Hugging Face").
    ChatMl { default_system: Option<String> },
    /// Llama 2: `[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant}</s><s>[INST] ...`
    /// (BOS of the first turn left to the tokenizer), as llama.cpp's `llama2-sys-bos`.
    Llama2,
    /// Llama 3: `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>` per message
    /// (BOS left to the tokenizer).
    Llama3,
}

impl ChatFormat {
    /// Detects the format of a `tokenizer.chat_template`. No template (`None`) means ChatML without a
    /// default system prompt, llama.cpp's fallback.
    pub fn detect(template: Option<&str>) -> Result<ChatFormat, TokenizerError> {
        let Some(t) = template else {
            return Ok(ChatFormat::ChatMl {
                default_system: None,
            });
        };
        if t.contains("<|im_start|>") {
            Ok(ChatFormat::ChatMl {
                default_system: default_chatml_system(t),
            })
        } else if t.contains("<|start_header_id|>") && t.contains("<|eot_id|>") {
            Ok(ChatFormat::Llama3)
        } else if t.contains("[INST]") && t.contains("<<SYS>>") {
            Ok(ChatFormat::Llama2)
        } else {
            let mut head: String = t.chars().take(80).collect();
            if head.len() < t.len() {
                head.push_str("...");
            }
            Err(TokenizerError::UnsupportedChatTemplate(
                head.escape_debug().to_string(),
            ))
        }
    }

    /// Renders `messages` as a prompt; with `add_generation_prompt`, ends with the assistant's turn
    /// opening so the model writes the reply. Runs [`render_into`](Self::render_into) in a buffer
    /// it allocates.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let guess = 64
            + messages
                .iter()
                .map(|m| m.role.len() + m.content.len() + 40)
                .sum::<usize>()
            + match self {
                ChatFormat::ChatMl {
                    default_system: Some(sys),
                } => sys.len() + 32,
                _ => 0,
            };
        let mut buf = vec![0u8; guess];
        let n = loop {
            match self.render_into(messages, add_generation_prompt, &mut buf) {
                Ok(n) => break n,
                Err(RenderError::TooLong { needed, .. }) => buf.resize(needed, 0),
            }
        };
        buf.truncate(n);
        // Only whole `str`s were copied in.
        String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Renders `messages` as [`render`](Self::render) does, into `out`, without allocating, and
    /// returns the number of bytes written (UTF-8).
    ///
    /// Errors: [`RenderError::TooLong`] when the prompt does not fit in `out` (then `out` holds its
    /// first `out.len()` bytes, possibly cut inside a char, and `needed` is its full length).
    pub fn render_into(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        out: &mut [u8],
    ) -> Result<usize, RenderError> {
        let mut s = Writer { out, n: 0 };
        self.walk(messages, add_generation_prompt, &mut |piece, _| {
            s.push_str(piece)
        });
        let limit = s.out.len();
        if s.n > limit {
            return Err(RenderError::TooLong { needed: s.n, limit });
        }
        Ok(s.n)
    }

    /// The prompt [`render_into`](Self::render_into) writes, piece by piece, in order: `emit(piece,
    /// is_marker)`. Markers are the template's own control-token texts (`<|im_start|>`,
    /// `<|eot_id|>`, `<s>`, ...), the only pieces the encoder may turn into control tokens
    /// ([`Tokenizer::encode_chat_into`](super::Tokenizer::encode_chat_into)); roles, contents and
    /// the template's other text are plain text.
    pub(crate) fn walk(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        emit: &mut dyn FnMut(&str, bool),
    ) {
        match self {
            ChatFormat::ChatMl { default_system } => {
                if let (Some(sys), Some(first)) = (default_system, messages.first()) {
                    if first.role != "system" {
                        push_chatml(emit, "system", sys);
                    }
                }
                let mut i = 0;
                while i < messages.len() {
                    let m = messages[i];
                    if m.role == "tool" && default_system.is_some() {
                        // Qwen2.5: consecutive tool results form one user turn.
                        emit("<|im_start|>", true);
                        emit("user", false);
                        while i < messages.len() && messages[i].role == "tool" {
                            emit("\n", false);
                            emit("<tool_response>", true);
                            emit("\n", false);
                            emit(messages[i].content, false);
                            emit("\n", false);
                            emit("</tool_response>", true);
                            i += 1;
                        }
                        emit("<|im_end|>", true);
                        emit("\n", false);
                        continue;
                    }
                    push_chatml(emit, m.role, m.content);
                    i += 1;
                }
                if add_generation_prompt {
                    emit("<|im_start|>", true);
                    emit("assistant\n", false);
                }
            }
            ChatFormat::Llama2 => {
                let mut inside_turn = true;
                emit("[INST] ", false);
                for m in messages {
                    let content = m.content.trim();
                    if !inside_turn {
                        inside_turn = true;
                        emit("<s>", true);
                        emit("[INST] ", false);
                    }
                    match m.role {
                        "system" => {
                            emit("<<SYS>>\n", false);
                            emit(content, false);
                            emit("\n<</SYS>>\n\n", false);
                        }
                        "user" => {
                            emit(content, false);
                            emit(" [/INST]", false);
                        }
                        _ => {
                            emit(content, false);
                            emit("</s>", true);
                            inside_turn = false;
                        }
                    }
                }
            }
            ChatFormat::Llama3 => {
                for m in messages {
                    emit("<|start_header_id|>", true);
                    emit(m.role, false);
                    emit("<|end_header_id|>", true);
                    emit("\n\n", false);
                    emit(m.content.trim(), false);
                    emit("<|eot_id|>", true);
                }
                if add_generation_prompt {
                    emit("<|start_header_id|>", true);
                    emit("assistant", false);
                    emit("<|end_header_id|>", true);
                    emit("\n\n", false);
                }
            }
        }
    }
}

/// Why [`ChatFormat::render_into`] could not render a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderError {
    /// The prompt is `needed` bytes long; the output holds `limit`.
    TooLong { needed: usize, limit: usize },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderError::TooLong { needed, limit } => write!(
                f,
                "chat prompt of {needed} bytes does not fit in the {limit}-byte buffer"
            ),
        }
    }
}

impl std::error::Error for RenderError {}

/// Where a prompt is rendered: `out` while it has room; past it only counted.
struct Writer<'o> {
    out: &'o mut [u8],
    n: usize,
}

impl Writer<'_> {
    fn push_str(&mut self, s: &str) {
        let b = s.as_bytes();
        if let Some(dst) = self.out.get_mut(self.n..) {
            let k = b.len().min(dst.len());
            dst[..k].copy_from_slice(&b[..k]);
        }
        self.n += b.len();
    }
}

fn push_chatml(emit: &mut dyn FnMut(&str, bool), role: &str, content: &str) {
    emit("<|im_start|>", true);
    emit(role, false);
    emit("\n", false);
    emit(content, false);
    emit("<|im_end|>", true);
    emit("\n", false);
}

/// The literal default system prompt of a ChatML template: the text of a string literal
/// `<|im_start|>system\n...<|im_end|>` (newline as a real char or as the escape `\n`) that holds no
/// template expression.
fn default_chatml_system(t: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    let mut from = 0;
    while let Some(p) = t[from..].find(OPEN) {
        let after = from + p + OPEN.len();
        from = after;
        let rest = &t[after..];
        let body = if let Some(r) = rest.strip_prefix("\\n") {
            r
        } else if let Some(r) = rest.strip_prefix('\n') {
            r
        } else {
            continue;
        };
        let Some(end) = body.find("<|im_end|>") else {
            continue;
        };
        let text = &body[..end];
        if text.is_empty() || text.contains(['\'', '"', '{', '}']) {
            continue;
        }
        return Some(unescape(text));
    }
    None
}

/// Undoes the escapes of a Jinja string literal (`\n`, `\t`, `\\`, `\'`, `\"`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(o) => out.push(o),
            None => out.push('\\'),
        }
    }
    out
}
