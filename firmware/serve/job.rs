//! The engine thread: takes queued requests in order, decodes each, and writes its response
//! into the requesting slot's [`Outbox`] (never to a socket, so no client can hold it up for
//! more than [`KEEP_UP_LIMIT`] at a time, [`KEEP_UP_BUDGET`] per request).
//!
//! A non-streamed answer is sent as it is generated too: its JSON opens before the first token
//! and closes after the last, in a response without `Content-Length` that ends when the
//! connection closes (as the event streams do). So an answer of any length arrives, whatever
//! its tokens' lengths, and no buffer is sized for the longest possible answer.

use super::api::{self, ApiError, ResponseMeta, Usage};
use super::http;
use super::json::Utf8Carry;
use super::outbox::{Outbox, PushError};
use super::server::{
    unix_now, EngineBuffers, Job, Server, KEEP_UP_BUDGET, KEEP_UP_LIMIT, METRICS, TICK,
};
use super::FixedBuf;
use crate::engine::generate::{
    check_request, generate, FinishReason, GenerateError, GenerateParams,
};
use crate::engine::sample::{Sampler, SamplerConfig};
use crate::engine::Decoder;
use crate::tokenizer::chat::ChatFormat;
use crate::tokenizer::{EncodeError, Tokenizer};
use core::fmt;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Why a generation stopped before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The client went away.
    Gone,
    /// The client could not keep up (its outbox stayed full).
    Slow,
    /// The shutdown grace ran out: the answer ends as if by `max_tokens`.
    Grace,
    /// A piece did not fit the event buffer.
    Overflow,
}

impl From<PushError> for Cut {
    fn from(e: PushError) -> Cut {
        match e {
            PushError::Closed => Cut::Gone,
            PushError::Full => Cut::Slow,
        }
    }
}

/// What the engine answered: the status for the metrics, and whether the rest of the outbox is
/// to be dropped rather than sent.
type Answered = (u16, bool);

fn push(outbox: &Outbox, bytes: &[u8]) -> Result<(), Cut> {
    Ok(outbox.push(bytes, KEEP_UP_LIMIT, KEEP_UP_BUDGET)?)
}

/// Renders one piece with `f` into `buf` and pushes it.
fn push_with(
    outbox: &Outbox,
    buf: &mut [u8],
    f: impl FnOnce(&mut FixedBuf) -> fmt::Result,
) -> Result<(), Cut> {
    let mut out = FixedBuf::new(buf);
    if f(&mut out).is_err() || out.overflowed() {
        return Err(Cut::Overflow);
    }
    push(outbox, out.as_bytes())
}

/// One server-sent event, `data: {json}\n\n`, rendered by `f`.
fn push_event(
    outbox: &Outbox,
    buf: &mut [u8],
    f: impl FnOnce(&mut FixedBuf) -> fmt::Result,
) -> Result<(), Cut> {
    use core::fmt::Write;
    push_with(outbox, buf, |out| {
        out.write_str("data: ")?;
        f(out)?;
        out.write_str("\n\n")
    })
}

/// An error response (before anything else was written).
fn answer_error(outbox: &Outbox, buf: &mut [u8], e: &ApiError) -> Answered {
    let mut scratch = [0u8; api::ERROR_BODY_MAX];
    let sent = push_with(outbox, buf, |out| {
        api::write_error_response(out, e, &mut scratch).map_err(|_| fmt::Error)
    });
    match sent {
        Ok(()) => (e.status, false),
        Err(_) => (499, true),
    }
}

/// Logs and counts a request cut short for its client's sake.
fn client_cut(id: u64, tokens: usize, cut: Cut) -> Answered {
    match cut {
        Cut::Slow => {
            METRICS.slow_clients_total.fetch_add(1, Ordering::Relaxed);
            crate::log_info!(
                "request {} cancelled after {} tokens: the client could not keep up",
                id,
                tokens
            );
            (499, true)
        }
        Cut::Overflow => {
            crate::log_error!(
                "request {} cancelled after {} tokens: a piece of the response did not fit its buffer",
                id,
                tokens
            );
            (500, true)
        }
        Cut::Gone | Cut::Grace => {
            crate::log_info!(
                "request {} cancelled after {} tokens: the client went away",
                id,
                tokens
            );
            (499, true)
        }
    }
}

impl Server<'_> {
    pub(super) fn engine_loop(
        &self,
        engine: &mut (dyn Decoder + Send),
        sampler: &mut Sampler,
        tok: &Tokenizer,
        chat: &ChatFormat,
        bufs: &mut EngineBuffers,
    ) {
        self.threads_up.fetch_add(1, Ordering::Release);
        loop {
            self.mark_engine_alive();
            let next = {
                let mut q = self.queue.q.lock().unwrap();
                loop {
                    if let Some(i) = q.pop_front() {
                        METRICS.queue_depth.store(q.len() as u64, Ordering::Relaxed);
                        break Some(i as usize);
                    }
                    if (self.cfg.shutdown)() {
                        break None;
                    }
                    q = self.queue.cv.wait_timeout(q, TICK).unwrap().0;
                    self.mark_engine_alive();
                }
            };
            let Some(i) = next else { return };
            let slot = &self.slots[i];
            let (status, abort) = {
                let job = slot.job.lock().unwrap();
                let mut deadline = Instant::now() + self.cfg.request_timeout;
                if let Some(grace) = self.grace_deadline() {
                    deadline = deadline.min(grace);
                }
                if slot.outbox.is_closed() {
                    crate::log_info!(
                        "request {} dropped: the client went away while queued",
                        job.id
                    );
                    (499, true)
                } else {
                    self.run_job(
                        &job,
                        &slot.outbox,
                        engine,
                        sampler,
                        tok,
                        chat,
                        bufs,
                        deadline,
                    )
                }
            };
            slot.outbox.finish(status, abort);
        }
    }

    /// Whether the shutdown grace has run out.
    fn past_grace(&self) -> bool {
        self.grace_deadline().is_some_and(|d| Instant::now() >= d)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_job(
        &self,
        job: &Job,
        outbox: &Outbox,
        engine: &mut (dyn Decoder + Send),
        sampler: &mut Sampler,
        tok: &Tokenizer,
        chat: &ChatFormat,
        bufs: &mut EngineBuffers,
        deadline: Instant,
    ) -> Answered {
        let Job {
            buf,
            body_start,
            body_end,
            chat: is_chat,
            id,
        } = job;
        let body = &buf[*body_start..*body_end];
        // Parse again into the engine's own buffer (the slot validated it already).
        let parsed = if *is_chat {
            api::parse_chat(body, &mut bufs.text).map(|r| (None, Some(r.messages), r.params))
        } else {
            api::parse_completion(body, &mut bufs.text).map(|r| (Some(r.prompt), None, r.params))
        };
        let (prompt_text, messages, params) = match parsed {
            Ok(p) => p,
            Err(e) => return answer_error(outbox, &mut bufs.event, &e),
        };
        let text: &str = match (prompt_text, &messages) {
            (Some(p), _) => p,
            (None, Some(m)) => match chat.render_into(m, true, &mut bufs.prompt) {
                Ok(n) => core::str::from_utf8(&bufs.prompt[..n]).unwrap_or(""),
                Err(_) => {
                    return answer_error(
                        outbox,
                        &mut bufs.event,
                        &ApiError::new(
                            422,
                            Some("messages"),
                            format_args!("the conversation is too long"),
                        ),
                    )
                }
            },
            (None, None) => "",
        };
        // Only with --log-prompts (a debugging aid): prompts stay out of the logs otherwise.
        crate::sys::log::log_prompt(*id, text);
        let add_bos = tok.add_bos_default() || text.is_empty();
        // Control tokens come only from the chat template's own markers: message contents and
        // completion prompts are plain text, so a client cannot forge a turn.
        let encoded = match &messages {
            Some(m) => tok.encode_chat_into(
                chat,
                m,
                true,
                text,
                add_bos,
                &mut bufs.scratch,
                &mut bufs.tokens,
            ),
            None => tok.encode_into(text, add_bos, false, &mut bufs.scratch, &mut bufs.tokens),
        };
        let n = match encoded {
            Ok(n) => n,
            Err(EncodeError::TooLong { needed, .. }) => {
                return answer_error(
                    outbox,
                    &mut bufs.event,
                    &ApiError::new(
                        422,
                        Some(if *is_chat { "messages" } else { "prompt" }),
                        format_args!(
                            "the prompt is {needed} tokens or more, but the context holds {}",
                            engine.context()
                        ),
                    ),
                );
            }
        };
        let prompt = &bufs.tokens[..n];
        let max_tokens = (params.max_tokens as usize).min(engine.context().saturating_sub(n));
        let stops: heapless::Vec<&str, 4> = params.stop.iter().copied().collect();
        let gp = GenerateParams {
            max_tokens,
            stop: &stops,
            deadline: Some(deadline),
        };
        match check_request(engine, prompt, &gp) {
            Ok(()) => {}
            Err(GenerateError::PromptTooLong { tokens, context }) => {
                return answer_error(
                    outbox,
                    &mut bufs.event,
                    &ApiError::new(
                        422,
                        Some(if *is_chat { "messages" } else { "prompt" }),
                        format_args!("the prompt is {tokens} tokens, but the context holds {context} (one must be left to generate)"),
                    ),
                );
            }
            Err(e) => {
                return answer_error(
                    outbox,
                    &mut bufs.event,
                    &ApiError::new(400, None, format_args!("{e}")),
                )
            }
        }
        let seed = params
            .seed
            .unwrap_or_else(|| *id ^ unix_now().rotate_left(17));
        sampler.reset(SamplerConfig {
            temperature: params.temperature,
            top_k: params.top_k as usize,
            top_p: params.top_p,
            seed,
        });
        let meta = ResponseMeta {
            id: *id,
            created: unix_now(),
            model: self.cfg.model_name,
        };
        let stream_mode = params.stream;
        let event = &mut bufs.event;
        // The head, and what comes before the first token.
        let opened = if stream_mode {
            push_with(outbox, event, |out| {
                http::write_sse_head(out).map_err(|_| fmt::Error)
            })
            .and_then(|()| {
                if *is_chat {
                    push_event(outbox, event, |out| api::write_chat_role_chunk(out, &meta))
                } else {
                    Ok(())
                }
            })
        } else {
            push_with(outbox, event, |out| {
                let head = http::ResponseHead {
                    status: 200,
                    content_type: http::JSON,
                    content_length: None,
                    allow: None,
                    retry_after: None,
                };
                http::write_head(out, &head).map_err(|_| fmt::Error)?;
                if *is_chat {
                    api::write_chat_completion_open(out, &meta)
                } else {
                    api::write_completion_open(out, &meta)
                }
            })
        };
        if let Err(cut) = opened {
            return client_cut(*id, 0, cut);
        }
        let mut carry = Utf8Carry::default();
        let mut cut: Option<Cut> = None;
        let stats = generate(engine, sampler, tok, prompt, &gp, &mut |bytes| {
            self.mark_engine_alive();
            // Past the grace the text so far still goes out (this piece, and what the stop
            // window holds back), but generation ends.
            if cut.is_none() && self.past_grace() {
                cut = Some(Cut::Grace);
            }
            if cut.is_some_and(|c| c != Cut::Grace) {
                return false;
            }
            let pushed = if stream_mode {
                push_event(outbox, event, |out| {
                    if *is_chat {
                        api::write_chat_chunk(out, &meta, &mut carry, bytes)
                    } else {
                        api::write_completion_chunk(out, &meta, &mut carry, bytes)
                    }
                })
            } else {
                push_with(outbox, event, |out| carry.push(bytes, out))
            };
            if let Err(c) = pushed {
                cut = Some(c);
            }
            cut.is_none()
        });
        let mut stats = match stats {
            Ok(s) => s,
            // check_request passed above, so generate cannot refuse the request now.
            Err(_) => {
                crate::log_error!("request {} failed to generate", *id);
                return (500, true);
            }
        };
        if stats.finish == FinishReason::Cancelled {
            match cut {
                Some(Cut::Grace) => {
                    stats.finish = FinishReason::Length;
                    crate::log_info!(
                        "request {} ended after {} tokens: the shutdown grace ran out",
                        *id,
                        stats.generated_tokens
                    );
                }
                Some(c) => return client_cut(*id, stats.generated_tokens, c),
                None => return client_cut(*id, stats.generated_tokens, Cut::Gone),
            }
        }
        if let Some(st) = engine.stream_stats() {
            METRICS.record_stream(&st);
        }
        let usage = Usage {
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.generated_tokens,
        };
        // The engine failed mid-answer (an FFN block could not be read): the text so far goes
        // out, the answer ends with finish_reason "error" and the error, and the daemon serves on.
        let failed = stats.error.map(|e| {
            crate::log_error!(
                "request {} failed: FFN block {} could not be read after {} attempts",
                *id,
                e.block as u64,
                e.attempts as u64
            );
            ApiError::new(
                500,
                None,
                format_args!("the FFN stream from the flash image failed: {e}"),
            )
        });
        if stats.generated_tokens > 0 {
            METRICS.record_ttft(stats.prefill_secs);
        }
        METRICS.record_generation(
            stats.prompt_tokens as u64,
            stats.generated_tokens as u64,
            stats.decode_tok_per_s(),
        );
        let closed = if stream_mode {
            push_event(outbox, event, |out| {
                if *is_chat {
                    api::write_chat_final_chunk(out, &meta, &mut carry, stats.finish, Some(&usage))
                } else {
                    api::write_completion_final_chunk(
                        out,
                        &meta,
                        &mut carry,
                        stats.finish,
                        Some(&usage),
                    )
                }
            })
            .and_then(|()| match &failed {
                Some(e) => push_event(outbox, event, |out| api::write_error(out, e)),
                None => Ok(()),
            })
            .and_then(|()| push(outbox, b"data: [DONE]\n\n"))
        } else {
            push_with(outbox, event, |out| {
                if *is_chat {
                    api::write_chat_completion_close(
                        out,
                        &mut carry,
                        stats.finish,
                        &usage,
                        failed.as_ref(),
                    )
                } else {
                    api::write_completion_close(
                        out,
                        &mut carry,
                        stats.finish,
                        &usage,
                        failed.as_ref(),
                    )
                }
            })
        };
        if let Err(c) = closed {
            return client_cut(*id, stats.generated_tokens, c);
        }
        crate::log_info!(
            "request {} done: {} prompt tokens, {} generated, {} tok/s",
            *id,
            stats.prompt_tokens,
            stats.generated_tokens,
            stats.decode_tok_per_s() as u64
        );
        if failed.is_some() {
            return (500, false);
        }
        (200, false)
    }
}
