//! The generation loop shared by the CLI and the daemon: prefill the prompt, then sample,
//! stream and stop (end of text, a stop string, max tokens, the context, or the caller).
//! After the prompt is in, it allocates nothing: stop strings are matched in a fixed window.

use super::sample::Sampler;
use super::Decoder;
use crate::tokenizer::Tokenizer;
use std::time::Instant;

/// At most this many stop strings, each at most `MAX_STOP_BYTES` long (OpenAI allows 4).
pub const MAX_STOPS: usize = 4;
pub const MAX_STOP_BYTES: usize = 128;
/// Bytes held back while they might still become a stop string, plus one token's bytes.
const WINDOW: usize = 2 * MAX_STOP_BYTES + 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End of text or a stop string.
    Stop,
    /// max_tokens or the end of the context.
    Length,
    /// The caller's `emit` asked to stop (a client went away).
    Cancelled,
    /// The engine failed (an FFN block could not be read): `GenerateStats::error` says why.
    Error,
}

impl FinishReason {
    /// The name OpenAI's API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub finish: FinishReason,
    /// Why the engine failed (`FinishReason::Error`): the text before it is good.
    pub error: Option<crate::stream::ReadError>,
}

impl GenerateStats {
    pub fn prefill_tok_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }
    /// Decode speed over the tokens after the first (the first comes out of the prefill).
    pub fn decode_tok_per_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerateError {
    EmptyPrompt,
    PromptTooLong { tokens: usize, context: usize },
    TooManyStops(usize),
    StopTooLong(usize),
    TokenOutOfVocab(u32),
}

impl std::fmt::Display for GenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenerateError::EmptyPrompt => {
                write!(f, "the prompt is empty (and the model adds no BOS token)")
            }
            GenerateError::PromptTooLong { tokens, context } => {
                write!(f, "the prompt is {tokens} tokens, but the context holds {context} (one must be left to generate)")
            }
            GenerateError::TooManyStops(n) => {
                write!(f, "{n} stop strings given, at most {MAX_STOPS} allowed")
            }
            GenerateError::StopTooLong(n) => write!(
                f,
                "a stop string of {n} bytes, at most {MAX_STOP_BYTES} allowed"
            ),
            GenerateError::TokenOutOfVocab(t) => write!(f, "token {t} is outside the vocabulary"),
        }
    }
}

impl std::error::Error for GenerateError {}

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct GenerateParams<'s> {
    pub max_tokens: usize,
    pub stop: &'s [&'s str],
    /// Generation ends (finish "length") once this instant has passed.
    pub deadline: Option<Instant>,
}

/// Holds back output that might be the start of a stop string.
struct StopWindow<'s> {
    stops: &'s [&'s str],
    pending: heapless::Vec<u8, WINDOW>,
}

impl<'s> StopWindow<'s> {
    /// Adds `bytes`; emits what can no longer be part of a stop string. Returns true when a stop
    /// string was found (the text before it has been emitted).
    fn push(&mut self, bytes: &[u8], emit: &mut dyn FnMut(&[u8]) -> bool) -> (bool, bool) {
        if self.stops.is_empty() {
            return (false, emit(bytes));
        }
        let mut keep_going = true;
        for chunk in bytes.chunks(WINDOW / 2) {
            if self.pending.len() + chunk.len() > WINDOW {
                // Longer than any stop string can reach back: flush the oldest half.
                let cut = self.pending.len() - MAX_STOP_BYTES;
                keep_going &= emit(&self.pending[..cut]);
                self.drop_front(cut);
            }
            self.pending
                .extend_from_slice(chunk)
                .expect("window has room after the flush");
            if let Some(at) = self.find_stop() {
                if at > 0 {
                    keep_going &= emit(&self.pending[..at]);
                }
                self.pending.clear();
                return (true, keep_going);
            }
        }
        let hold = self.held_suffix();
        let cut = self.pending.len() - hold;
        if cut > 0 {
            keep_going &= emit(&self.pending[..cut]);
            self.drop_front(cut);
        }
        (false, keep_going)
    }

    fn find_stop(&self) -> Option<usize> {
        let p = &self.pending[..];
        self.stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| p.windows(s.len()).position(|w| w == s.as_bytes()))
            .min()
    }

    /// Length of the longest tail of `pending` that is a proper prefix of a stop string.
    fn held_suffix(&self) -> usize {
        let p = &self.pending[..];
        let mut hold = 0;
        for s in self.stops.iter().map(|s| s.as_bytes()) {
            for k in (1..s.len().min(p.len() + 1)).rev() {
                if k > hold && p.ends_with(&s[..k]) {
                    hold = k;
                    break;
                }
            }
        }
        hold
    }

    fn drop_front(&mut self, n: usize) {
        let len = self.pending.len();
        self.pending.copy_within(n..len, 0);
        self.pending.truncate(len - n);
    }

    fn flush(&mut self, emit: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        let ok = self.pending.is_empty() || emit(&self.pending);
        self.pending.clear();
        ok
    }
}

/// Checks a request before any decoding: prompt length against the context, stop strings.
pub fn check_request(
    engine: &dyn Decoder,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<(), GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if prompt.len() >= engine.context() {
        return Err(GenerateError::PromptTooLong {
            tokens: prompt.len(),
            context: engine.context(),
        });
    }
    if let Some(&t) = prompt
        .iter()
        .find(|&&t| t as usize >= engine.hyper().vocab_size)
    {
        return Err(GenerateError::TokenOutOfVocab(t));
    }
    if params.stop.len() > MAX_STOPS {
        return Err(GenerateError::TooManyStops(params.stop.len()));
    }
    if let Some(s) = params.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(GenerateError::StopTooLong(s.len()));
    }
    Ok(())
}

/// Generates after `prompt`, handing each piece of text to `emit` as soon as it is final.
/// `emit` returns false to cancel (the request's client went away).
pub fn generate(
    engine: &mut dyn Decoder,
    sampler: &mut Sampler,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    emit: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<GenerateStats, GenerateError> {
    check_request(engine, prompt, params)?;
    let started = Instant::now();
    let mut window = StopWindow {
        stops: params.stop,
        pending: heapless::Vec::new(),
    };
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        generated_tokens: 0,
        prefill_secs: 0.0,
        decode_secs: 0.0,
        finish: FinishReason::Length,
        error: None,
    };
    // Each step forwards `token` at `pos`; the first runs the whole prompt (`prefill`).
    let last = prompt.len() - 1;
    let mut token = prompt[last];
    let mut pos = last;
    let mut decode_started = started;
    engine.begin_sequence();
    while stats.generated_tokens < params.max_tokens && pos < engine.context() {
        if params.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let next = if stats.generated_tokens == 0 {
            sampler.sample(engine.prefill(prompt, 0))
        } else if sampler.is_greedy() {
            engine.forward_greedy(token, pos)
        } else {
            sampler.sample(engine.forward(token, pos))
        };
        if let Some(e) = engine.take_error() {
            // The token came from a layer that lacked blocks: not emitted; the request ends.
            stats.finish = FinishReason::Error;
            stats.error = Some(e);
            break;
        }
        if stats.generated_tokens == 0 {
            stats.prefill_secs = started.elapsed().as_secs_f64();
            decode_started = Instant::now();
        }
        stats.generated_tokens += 1;
        pos += 1;
        if tokenizer.is_end_of_generation(next) {
            stats.finish = FinishReason::Stop;
            break;
        }
        let (stopped, keep_going) = window.push(tokenizer.piece_after(token, next), emit);
        if stopped {
            stats.finish = FinishReason::Stop;
            break;
        }
        if !keep_going {
            stats.finish = FinishReason::Cancelled;
            break;
        }
        token = next;
    }
    if !matches!(stats.finish, FinishReason::Stop | FinishReason::Error) && !window.flush(emit) {
        stats.finish = FinishReason::Cancelled;
    }
    if stats.generated_tokens > 0 {
        stats.decode_secs = decode_started.elapsed().as_secs_f64();
    } else {
        stats.prefill_secs = started.elapsed().as_secs_f64();
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut w = StopWindow {
            stops,
            pending: heapless::Vec::new(),
        };
        let mut out = Vec::new();
        let mut emit = |b: &[u8]| {
            out.extend_from_slice(b);
            true
        };
        for p in pieces {
            if w.push(p.as_bytes(), &mut emit).0 {
                return (String::from_utf8(out).unwrap(), true);
            }
        }
        w.flush(&mut emit);
        (String::from_utf8(out).unwrap(), false)
    }

    #[test]
    fn stop_string_across_tokens_is_cut() {
        assert_eq!(
            run(&["\n\n"], &["Hello", "\n", "\nworld"]),
            ("Hello".to_string(), true)
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "D more"]),
            ("abc ".to_string(), true)
        );
    }

    #[test]
    fn near_misses_are_released() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "x"]),
            ("abc ENx".to_string(), false)
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), false));
    }

    #[test]
    fn long_output_without_stops_flows_through_the_window() {
        let piece = "0123456789".repeat(20);
        let pieces: Vec<&str> = (0..10).map(|_| piece.as_str()).collect();
        let (out, stopped) = run(&["zzz"], &pieces);
        assert!(!stopped);
        assert_eq!(out.len(), 2000);
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".to_string(), true));
    }
}
