//! Perplexity over non-overlapping windows of `ctx` tokens, no BOS: every token after the first
//! of a window is scored against the logits of the one before it (as llama.cpp's tool does with
//! `--ppl-stride 0` and no BOS; the figures in the issues are measured this way).

use super::Decoder;
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    pub windows: usize,
    pub scored_tokens: usize,
    /// Perplexity of each window on its own.
    pub per_window: Vec<f64>,
}

/// Why perplexity could not be measured.
#[derive(Debug, Clone, PartialEq)]
pub enum PerplexityError {
    /// A window of fewer than 2 tokens scores nothing.
    WindowTooSmall(usize),
    /// A window larger than the engine's context.
    WindowOverContext { ctx: usize, context: usize },
    /// A text shorter than one window.
    TextTooShort { tokens: usize, ctx: usize },
    /// An FFN block could not be read from the flash image.
    Read(crate::stream::ReadError),
}

impl fmt::Display for PerplexityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerplexityError::WindowTooSmall(ctx) => {
                write!(f, "--ctx must be at least 2, got {ctx}")
            }
            PerplexityError::WindowOverContext { ctx, context } => write!(
                f,
                "--ctx {ctx} is larger than the engine's context of {context}"
            ),
            PerplexityError::TextTooShort { tokens, ctx } => write!(
                f,
                "the text has {tokens} tokens, fewer than one window of {ctx}"
            ),
            PerplexityError::Read(e) => {
                write!(f, "the FFN stream from the flash image failed: {e}")
            }
        }
    }
}

impl std::error::Error for PerplexityError {}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<PerplexityError> for String {
    fn from(e: PerplexityError) -> String {
        e.to_string()
    }
}

/// `tokens` are the text's tokens; `ctx` must fit the engine's context. `chunks` caps the number
/// of windows (0 = all that fit). `progress` is told each finished window's perplexity.
pub fn perplexity(
    engine: &mut dyn Decoder,
    tokens: &[u32],
    ctx: usize,
    chunks: usize,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<Perplexity, PerplexityError> {
    if ctx < 2 {
        return Err(PerplexityError::WindowTooSmall(ctx));
    }
    if ctx > engine.context() {
        return Err(PerplexityError::WindowOverContext {
            ctx,
            context: engine.context(),
        });
    }
    let mut windows = tokens.len() / ctx;
    if chunks > 0 {
        windows = windows.min(chunks);
    }
    if windows == 0 {
        return Err(PerplexityError::TextTooShort {
            tokens: tokens.len(),
            ctx,
        });
    }
    let mut total_nll = 0.0f64;
    let mut per_window = Vec::with_capacity(windows);
    for w in 0..windows {
        let window = &tokens[w * ctx..(w + 1) * ctx];
        let mut nll = 0.0f64;
        engine.begin_sequence();
        engine.score(&window[..ctx - 1], 0, &mut |pos, logits| {
            nll += negative_log_likelihood(logits, window[pos + 1] as usize);
        });
        if let Some(e) = engine.take_error() {
            return Err(PerplexityError::Read(e));
        }
        total_nll += nll;
        let ppl = (nll / (ctx - 1) as f64).exp();
        per_window.push(ppl);
        progress(w, ppl);
    }
    let scored = windows * (ctx - 1);
    Ok(Perplexity {
        ppl: (total_nll / scored as f64).exp(),
        windows,
        scored_tokens: scored,
        per_window,
    })
}

/// `-log softmax(logits)[target]`, computed stably in f64.
pub fn negative_log_likelihood(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln() - logits[target] as f64
}

#[cfg(test)]
mod tests {
    use super::negative_log_likelihood;

    #[test]
    fn nll_of_uniform_logits_is_log_n() {
        let l = [3.0f32; 8];
        assert!((negative_log_likelihood(&l, 5) - (8f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn nll_is_stable_for_large_logits() {
        let l = [1000.0f32, 0.0];
        assert!(negative_log_likelihood(&l, 0).abs() < 1e-12);
        assert!((negative_log_likelihood(&l, 1) - 1000.0).abs() < 1e-9);
    }
}
