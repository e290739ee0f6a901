//! The text `calibrate` and `trace` read: a file, tokens skipped, whole windows kept.

use super::*;

#[derive(Args)]
pub struct TextArgs {
    /// The text.
    #[arg(long)]
    pub file: PathBuf,
    /// Tokens to skip at the start of the text (keeps calibration text apart from test text).
    #[arg(long, default_value_t = 0)]
    pub skip_tokens: usize,
    /// Tokens to use after the skipped ones (whole windows).
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Window: the KV cache restarts every `ctx` tokens, as in perplexity.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
}

/// The tokens `t` asks for: `skip_tokens` skipped, then whole windows of `ctx` up to `tokens`.
pub fn text_tokens(tok: &Tokenizer, t: &TextArgs) -> Result<Vec<u32>, String> {
    if t.ctx < 2 || t.tokens < t.ctx {
        return Err(format!(
            "--tokens {} must hold at least one window of --ctx {} (>= 2)",
            t.tokens, t.ctx
        ));
    }
    let text = std::fs::read(&t.file).map_err(|e| format!("{}: {e}", t.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let want = (t.skip_tokens + t.tokens).div_ceil(t.ctx);
    let all = tok.encode(text_prefix(&text, want + 1, t.ctx), false);
    if all.len() < t.skip_tokens + t.ctx {
        return Err(format!(
            "{} has {} tokens: none left after skipping {}",
            t.file.display(),
            all.len(),
            t.skip_tokens
        ));
    }
    let mut v = all[t.skip_tokens..].to_vec();
    v.truncate(t.tokens.min(v.len()) / t.ctx * t.ctx);
    Ok(v)
}

/// Enough of the text for `chunks` windows (whole lines, with a wide margin), so a long file is
/// not tokenized in full when only its start is scored.
pub fn text_prefix(text: &str, chunks: usize, ctx: usize) -> &str {
    if chunks == 0 {
        return text;
    }
    let want = chunks.saturating_mul(ctx).saturating_mul(16).max(4096);
    if want >= text.len() {
        return text;
    }
    match text[..want].rfind('\n') {
        Some(i) => &text[..=i],
        None => text,
    }
}
