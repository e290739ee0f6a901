//! `leanstream ask`, `chat` and `status`: the client of a running leanstreamd (`leanstream_tools::client`).

use super::*;

#[derive(Args)]
pub struct ClientArgs {
    /// The daemon's socket (default: the board's).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Most tokens to generate per answer (default: the daemon's).
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature; 0 is greedy (default: the daemon's).
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens only; 0 keeps every token (default: the daemon's).
    #[arg(long)]
    top_k: Option<u32>,
    /// Sample among the most likely tokens whose probabilities add up to P (default: the
    /// daemon's).
    #[arg(long)]
    top_p: Option<f32>,
    /// Random seed of the sampler, for repeatable answers (default: a fresh one per request).
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Args)]
pub struct AskArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Send the prompt as a chat message (the model's chat template) instead of raw text.
    #[arg(long)]
    chat: bool,
    /// The prompt (or, with --chat, the user's message).
    prompt: String,
}

impl ClientArgs {
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(leanstream::board::SOCKET_PATH))
    }
    fn options(&self, chat: bool) -> leanstream_tools::client::AskOptions {
        leanstream_tools::client::AskOptions {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            chat,
        }
    }
}

pub fn cmd_ask(a: AskArgs) -> Result<(), String> {
    let mut out = std::io::stdout();
    let summary = leanstream_tools::client::ask(
        &a.client.socket(),
        &a.prompt,
        &a.client.options(a.chat),
        &mut out,
    )
    .map_err(|e| e.to_string())?;
    println!();
    eprintln!(
        "finish: {} | completion tokens: {}",
        summary.finish_reason.as_deref().unwrap_or("?"),
        summary.completion_tokens
    );
    Ok(())
}

pub fn cmd_chat(a: ClientArgs) -> Result<(), String> {
    let stdin = std::io::stdin();
    leanstream_tools::client::chat_repl(
        &a.socket(),
        &a.options(true),
        &mut stdin.lock(),
        &mut std::io::stdout(),
    )
    .map_err(|e| e.to_string())
}

pub fn cmd_status(socket: Option<PathBuf>) -> Result<(), String> {
    let socket = socket.unwrap_or_else(|| PathBuf::from(leanstream::board::SOCKET_PATH));
    leanstream_tools::client::status(&socket, &mut std::io::stdout()).map_err(|e| e.to_string())
}
