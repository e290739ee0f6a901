//! The daemon's serving loop: one acceptor, a fixed set of client slots (one thread each, made at
//! boot), a fixed FIFO of requests, and one engine thread that decodes one request at a time.
//!
//! - The acceptor checks each peer's credentials (SO_PEERCRED) against the board's allowlist
//!   (403 otherwise), then hands the connection to a free slot, or answers 503 when every slot
//!   is busy.
//! - A slot thread reads the request into its fixed buffer under the read deadline (408),
//!   answers GETs and every malformed request itself, validates completions, and queues them;
//!   a full queue is a 503 at once.
//! - The engine thread parses the queued request again into its own buffers, renders the chat
//!   template, tokenizes, decodes, and writes the response or the event stream straight to the
//!   client. A client that hangs up is noticed within one token and its generation cancelled.
//!
//! After boot nothing here allocates: every buffer is made once in [`Server::new`].

use super::api::{self, ApiError, ResponseMeta, Usage};
use super::http::{self, Route};
use super::json::Utf8Carry;
use super::metrics::{render_prometheus, Metrics};
use super::{FixedBuf, StdWriter};
use crate::engine::generate::{
    check_request, generate, FinishReason, GenerateError, GenerateParams,
};
use crate::engine::sample::{Sampler, SamplerConfig};
use crate::engine::Decoder;
use crate::tokenizer::chat::ChatFormat;
use crate::tokenizer::{EncodeError, EncodeScratch, Tokenizer};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The daemon's counters, for `GET /metrics`.
pub static METRICS: Metrics = Metrics::new();

/// Bytes of generated text a non-streamed response can hold per token of context.
const TEXT_BYTES_PER_TOKEN: usize = 32;
/// How often idle threads look at the shutdown flag.
const TICK: Duration = Duration::from_millis(100);
/// How long an early answer waits for the client to finish sending before closing.
const LINGER: Duration = Duration::from_millis(200);

/// What the server is told at boot.
pub struct ServerConfig<'a> {
    /// The model's name in responses and `/v1/models`.
    pub model_name: &'a str,
    pub allowed_uids: &'a [u32],
    pub allowed_gids: &'a [u32],
    /// Client slots (connections served at once).
    pub max_clients: usize,
    /// Requests that may wait for the engine.
    pub queue_depth: usize,
    /// Bytes of one request, head and body.
    pub max_request_bytes: usize,
    /// A client must have sent its whole request within this.
    pub read_timeout: Duration,
    /// A generation stops after this long.
    pub request_timeout: Duration,
    /// After SIGTERM, the running request gets at most this long to finish.
    pub shutdown_grace: Duration,
    /// Set from the signal handler: stop accepting, finish the running request, return.
    pub shutdown: &'a (dyn Fn() -> bool + Sync),
    /// Called from the acceptor about every 100 ms while the engine is healthy (watchdog pings).
    pub on_tick: &'a (dyn Fn() + Sync),
    /// Heap allocations since boot finished, if the binary counts them (shown in `/metrics`).
    pub allocations: &'a (dyn Fn() -> Option<u64> + Sync),
    /// Called once every thread and buffer exists, before the first connection is accepted:
    /// boot is over (tell systemd READY=1, start counting allocations).
    pub on_ready: &'a (dyn Fn() + Sync),
}

/// A request handed from a slot thread to the engine thread.
struct Job {
    stream: Option<UnixStream>,
    buf: Box<[u8]>,
    /// The body is `buf[body_start..body_end]`.
    body_start: usize,
    body_end: usize,
    chat: bool,
    id: u64,
}

/// One client slot: its thread, its buffers, and the hand-offs with the acceptor and engine.
struct Slot {
    busy: AtomicBool,
    inbox: Mutex<Option<UnixStream>>,
    inbox_cv: Condvar,
    job: Mutex<Job>,
    /// The slot thread's own text buffer, for validating a body before it is queued.
    text: Mutex<Box<[u8]>>,
    done: Mutex<bool>,
    done_cv: Condvar,
}

/// The engine thread's buffers, each sized once at boot.
struct EngineBuffers {
    text: Box<[u8]>,
    prompt: Box<[u8]>,
    tokens: Box<[u32]>,
    response: Box<[u8]>,
    /// A whole non-streamed JSON response (the text, escaped, plus the envelope).
    json: Box<[u8]>,
    event: Box<[u8]>,
    scratch: EncodeScratch,
}

/// The FIFO of slot indices waiting for the engine.
struct Queue {
    q: Mutex<heapless::Deque<u16, 64>>,
    cv: Condvar,
    depth: usize,
}

pub struct Server<'a> {
    cfg: ServerConfig<'a>,
    slots: Box<[Slot]>,
    queue: Queue,
    next_id: AtomicU64,
    /// Milliseconds since `started` when the engine thread last showed life.
    engine_alive_ms: AtomicU64,
    started: Instant,
    /// Threads that have started their loops (slots + engine).
    threads_up: AtomicU64,
}

/// A zeroed buffer whose pages are all resident now (a fresh allocation of zeros is only
/// backed by memory as it is first written, which would make the daemon grow while serving).
fn resident<T: Copy + Default>(n: usize) -> Box<[T]> {
    let mut b = vec![T::default(); n].into_boxed_slice();
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for i in (0..n).step_by(step) {
        // SAFETY: `i < n`, in bounds of the buffer we own; volatile so it is not elided.
        unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(i), T::default()) };
    }
    b
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Writes an error response and counts it; a client that is gone is not an error of ours.
fn answer_error(stream: &mut UnixStream, e: &ApiError) {
    let mut scratch = [0u8; api::ERROR_BODY_MAX];
    let _ = api::write_error_response(&mut StdWriter(&mut *stream), e, &mut scratch);
    METRICS.record_status(e.status);
    linger(stream);
}

/// Ends our side, then reads and discards what the client still sends (briefly): closing a Unix
/// socket with unread bytes makes the peer's read fail with ECONNRESET before it sees the answer.
fn linger(stream: &mut UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(LINGER));
    let until = Instant::now() + LINGER;
    let mut sink = [0u8; 512];
    while Instant::now() < until {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

/// True when the peer has closed its end (its generation should stop).
fn peer_gone(stream: &UnixStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => false,
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => true,
    }
}

impl<'a> Server<'a> {
    /// Makes every slot and buffer the server will use.
    pub fn new(cfg: ServerConfig<'a>) -> Server<'a> {
        assert!(cfg.queue_depth <= 64, "request queue deeper than 64");
        assert!(cfg.max_clients <= u16::MAX as usize);
        let slots = (0..cfg.max_clients)
            .map(|_| Slot {
                busy: AtomicBool::new(false),
                inbox: Mutex::new(None),
                inbox_cv: Condvar::new(),
                job: Mutex::new(Job {
                    stream: None,
                    buf: resident(cfg.max_request_bytes),
                    body_start: 0,
                    body_end: 0,
                    chat: false,
                    id: 0,
                }),
                text: Mutex::new(resident(cfg.max_request_bytes)),
                done: Mutex::new(false),
                done_cv: Condvar::new(),
            })
            .collect();
        let depth = cfg.queue_depth;
        Server {
            cfg,
            slots,
            queue: Queue {
                q: Mutex::new(heapless::Deque::new()),
                cv: Condvar::new(),
                depth,
            },
            next_id: AtomicU64::new(1),
            engine_alive_ms: AtomicU64::new(0),
            started: Instant::now(),
            threads_up: AtomicU64::new(0),
        }
    }

    fn mark_engine_alive(&self) {
        self.engine_alive_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Serves until shutdown is requested, then lets the running request finish (bounded by
    /// `shutdown_grace`) and returns.
    pub fn run(
        &self,
        listener: &UnixListener,
        engine: &mut (dyn Decoder + Send),
        sampler: &mut Sampler,
        tok: &Tokenizer,
        chat: &ChatFormat,
    ) {
        let max_text = self.cfg.max_request_bytes;
        let context = engine.context();
        let mut bufs = EngineBuffers {
            text: resident(max_text),
            prompt: resident(max_text * 2 + 4096),
            tokens: resident(context),
            response: resident(context * TEXT_BYTES_PER_TOKEN),
            json: resident(context * TEXT_BYTES_PER_TOKEN * 2 + 4096),
            event: resident(4096 + api::ERROR_BODY_MAX),
            scratch: EncodeScratch::new(max_text * 2 + 4096),
        };
        // Encode the longest text the scratch takes once, so its pages are resident too.
        bufs.prompt.fill(b'a');
        if let Ok(longest) = core::str::from_utf8(&bufs.prompt) {
            let _ = tok.encode_into(longest, false, false, &mut bufs.scratch, &mut bufs.tokens);
        }
        self.mark_engine_alive();
        std::thread::scope(|s| {
            for i in 0..self.slots.len() {
                std::thread::Builder::new()
                    .name(format!("slot-{i}"))
                    .spawn_scoped(s, move || self.slot_loop(i))
                    .expect("spawn slot thread");
            }
            let bufs = &mut bufs;
            std::thread::Builder::new()
                .name("engine".into())
                .spawn_scoped(s, move || {
                    engine.bind_thread();
                    self.engine_loop(engine, sampler, tok, chat, bufs)
                })
                .expect("spawn engine thread");
            let all = self.slots.len() as u64 + 1;
            while self.threads_up.load(Ordering::Acquire) < all {
                std::thread::sleep(Duration::from_millis(1));
            }
            (self.cfg.on_ready)();
            self.accept_loop(listener);
        });
    }

    fn accept_loop(&self, listener: &UnixListener) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let _ = listener.set_nonblocking(true);
        while !(self.cfg.shutdown)() {
            let alive = self.engine_alive_ms.load(Ordering::Relaxed);
            if (self.started.elapsed().as_millis() as u64).saturating_sub(alive) < 10_000 {
                (self.cfg.on_tick)();
            }
            let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(TICK.as_millis() as u16)) {
                Ok(0) | Err(_) => continue,
                Ok(_) => {}
            }
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(_) => continue,
            };
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(self.cfg.read_timeout));
            match crate::sys::socket::peer_credentials(&stream) {
                Ok((uid, gid, pid))
                    if crate::sys::socket::peer_allowed(
                        uid,
                        gid,
                        self.cfg.allowed_uids,
                        self.cfg.allowed_gids,
                    ) =>
                {
                    let _ = pid;
                }
                Ok((uid, gid, pid)) => {
                    crate::log_warn!(
                        "refused peer uid {} gid {} pid {}: not on the allowlist",
                        uid,
                        gid,
                        pid
                    );
                    answer_error(&mut stream, &ApiError::forbidden());
                    continue;
                }
                Err(_) => {
                    answer_error(&mut stream, &ApiError::forbidden());
                    continue;
                }
            }
            let free = self.slots.iter().position(|s| {
                s.busy
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
            match free {
                Some(i) => {
                    let slot = &self.slots[i];
                    *slot.inbox.lock().unwrap() = Some(stream);
                    slot.inbox_cv.notify_one();
                }
                None => answer_error(&mut stream, &ApiError::queue_full()),
            }
        }
        crate::log_info!("shutdown requested: no longer accepting connections");
        // Wake everyone so they see the flag.
        self.queue.cv.notify_all();
        for s in self.slots.iter() {
            s.inbox_cv.notify_all();
        }
    }

    fn slot_loop(&self, i: usize) {
        let slot = &self.slots[i];
        self.threads_up.fetch_add(1, Ordering::Release);
        loop {
            let stream = {
                let mut inbox = slot.inbox.lock().unwrap();
                loop {
                    if let Some(s) = inbox.take() {
                        break Some(s);
                    }
                    if (self.cfg.shutdown)() {
                        break None;
                    }
                    inbox = slot.inbox_cv.wait_timeout(inbox, TICK).unwrap().0;
                }
            };
            let Some(stream) = stream else { return };
            METRICS.active_clients.fetch_add(1, Ordering::Relaxed);
            self.serve_connection(slot, i, stream);
            METRICS.active_clients.fetch_sub(1, Ordering::Relaxed);
            slot.busy.store(false, Ordering::Release);
        }
    }

    /// Reads one request, answers what needs no engine, queues the rest and waits for it.
    fn serve_connection(&self, slot: &Slot, index: usize, mut stream: UnixStream) {
        let deadline = Instant::now() + self.cfg.read_timeout;
        let mut job = slot.job.lock().unwrap();
        let limit = self.cfg.max_request_bytes;
        let mut len = 0;
        let mut head = None;
        let mut continued = false;
        loop {
            if let Some(h) = head {
                let h: http::Head = h;
                if len >= h.total_len() {
                    break;
                }
                if h.expect_continue && !continued {
                    continued = true;
                    let _ = http::write_continue(&mut StdWriter(&mut stream));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return answer_error(
                    &mut stream,
                    &ApiError::new(
                        408,
                        None,
                        format_args!("the request did not arrive in time"),
                    ),
                );
            }
            let _ = stream.set_read_timeout(Some(left));
            // parse_head refuses heads and bodies past `limit`, so there is always room here.
            let cap = job.buf.len().min(limit);
            let n = match stream.read(&mut job.buf[len..cap]) {
                Ok(0) => {
                    // The client closed before a whole request: nobody to answer.
                    METRICS.record_status(499);
                    return;
                }
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return answer_error(
                        &mut stream,
                        &ApiError::new(
                            408,
                            None,
                            format_args!("the request did not arrive in time"),
                        ),
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return METRICS.record_status(499),
            };
            len += n;
            if head.is_none() {
                match http::parse_head_limited(&job.buf[..len], limit) {
                    Ok(Some(h)) => head = Some(h),
                    Ok(None) if len >= limit => {
                        return answer_error(&mut stream, &http::HttpError::HeadersTooLarge.into())
                    }
                    Ok(None) => {}
                    Err(e) => return answer_error(&mut stream, &e.into()),
                }
            }
        }
        let head = head.expect("loop ends with a head");
        let route = http::route(head.method, head.path(&job.buf[..len]));
        let body = head.head_len..head.total_len();
        let chat = match route {
            Route::Completions => false,
            Route::ChatCompletions => true,
            Route::Health | Route::Models | Route::Metrics => {
                return self.answer_get(&mut stream, route, &mut job.buf);
            }
            Route::NotFound => return answer_error(&mut stream, &ApiError::not_found()),
            Route::MethodNotAllowed(allow) => {
                return answer_error(&mut stream, &ApiError::method_not_allowed(allow))
            }
        };
        // Validate now, so a bad request gets its 400 without waiting for the engine.
        {
            let mut text = slot.text.lock().unwrap();
            let checked = if chat {
                api::parse_chat(&job.buf[body.clone()], &mut text).map(|_| ())
            } else {
                api::parse_completion(&job.buf[body.clone()], &mut text).map(|_| ())
            };
            if let Err(e) = checked {
                return answer_error(&mut stream, &e);
            }
        }
        job.stream = Some(stream);
        job.body_start = body.start;
        job.body_end = body.end;
        job.chat = chat;
        job.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        drop(job);
        *slot.done.lock().unwrap() = false;
        let queued = {
            let mut q = self.queue.q.lock().unwrap();
            if q.len() >= self.queue.depth || (self.cfg.shutdown)() {
                false
            } else {
                q.push_back(index as u16).expect("depth <= capacity");
                METRICS.queue_depth.store(q.len() as u64, Ordering::Relaxed);
                true
            }
        };
        if !queued {
            let mut job = slot.job.lock().unwrap();
            if let Some(mut s) = job.stream.take() {
                answer_error(&mut s, &ApiError::queue_full());
            }
            return;
        }
        self.queue.cv.notify_one();
        let mut done = slot.done.lock().unwrap();
        while !*done {
            done = slot.done_cv.wait(done).unwrap();
        }
    }

    fn answer_get(&self, stream: &mut UnixStream, route: Route, buf: &mut [u8]) {
        let mut body = FixedBuf::new(buf);
        let content_type = match route {
            Route::Health => {
                let _ = api::write_health(&mut body, self.cfg.model_name);
                http::JSON
            }
            Route::Models => {
                let _ = api::write_models(&mut body, self.cfg.model_name, unix_now());
                http::JSON
            }
            _ => {
                let _ = render_prometheus(&METRICS, &mut body);
                if let Some(n) = (self.cfg.allocations)() {
                    use core::fmt::Write;
                    let _ = write!(
                        body,
                        "# HELP leanstream_heap_allocations_after_boot_total Heap allocations since boot finished (should stay 0).\n\
                         # TYPE leanstream_heap_allocations_after_boot_total counter\n\
                         leanstream_heap_allocations_after_boot_total {n}\n"
                    );
                }
                http::PROMETHEUS
            }
        };
        let ok = !body.overflowed();
        let len = body.len();
        if ok {
            let _ =
                http::write_response(&mut StdWriter(&mut *stream), 200, content_type, &buf[..len]);
            METRICS.record_status(200);
        } else {
            answer_error(stream, &ApiError::server_error("response too large"));
        }
    }

    fn engine_loop(
        &self,
        engine: &mut (dyn Decoder + Send),
        sampler: &mut Sampler,
        tok: &Tokenizer,
        chat: &ChatFormat,
        bufs: &mut EngineBuffers,
    ) {
        let mut shutdown_at: Option<Instant> = None;
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
            {
                let mut job = slot.job.lock().unwrap();
                if (self.cfg.shutdown)() {
                    shutdown_at.get_or_insert_with(Instant::now);
                }
                let mut deadline = Instant::now() + self.cfg.request_timeout;
                if let Some(t) = shutdown_at {
                    deadline = deadline.min(t + self.cfg.shutdown_grace);
                }
                self.run_job(&mut job, engine, sampler, tok, chat, bufs, deadline);
                job.stream = None;
            }
            *slot.done.lock().unwrap() = true;
            slot.done_cv.notify_one();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_job(
        &self,
        job: &mut Job,
        engine: &mut (dyn Decoder + Send),
        sampler: &mut Sampler,
        tok: &Tokenizer,
        chat: &ChatFormat,
        bufs: &mut EngineBuffers,
        deadline: Instant,
    ) {
        let Job {
            stream,
            buf,
            body_start,
            body_end,
            chat: is_chat,
            id,
        } = job;
        let Some(stream) = stream.as_mut() else {
            return;
        };
        let body = &buf[*body_start..*body_end];
        // Parse again into the engine's own buffer (the slot validated it already).
        let parsed = if *is_chat {
            api::parse_chat(body, &mut bufs.text).map(|r| (None, Some(r.messages), r.params))
        } else {
            api::parse_completion(body, &mut bufs.text).map(|r| (Some(r.prompt), None, r.params))
        };
        let (prompt_text, messages, params) = match parsed {
            Ok(p) => p,
            Err(e) => return answer_error(stream, &e),
        };
        let text: &str = match (prompt_text, &messages) {
            (Some(p), _) => p,
            (None, Some(m)) => match chat.render_into(m, true, &mut bufs.prompt) {
                Ok(n) => core::str::from_utf8(&bufs.prompt[..n]).unwrap_or(""),
                Err(_) => {
                    return answer_error(
                        stream,
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
                    stream,
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
                    stream,
                    &ApiError::new(
                        422,
                        Some(if *is_chat { "messages" } else { "prompt" }),
                        format_args!("the prompt is {tokens} tokens, but the context holds {context} (one must be left to generate)"),
                    ),
                );
            }
            Err(e) => return answer_error(stream, &ApiError::new(400, None, format_args!("{e}"))),
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
        let mut carry = Utf8Carry::default();
        let mut text_len = 0usize;
        let stream_mode = params.stream;
        if stream_mode {
            let mut w = StdWriter(&mut *stream);
            let mut ok = http::write_sse_head(&mut w).is_ok();
            if ok && *is_chat {
                let mut ev = FixedBuf::new(&mut bufs.event);
                let _ = api::write_chat_role_chunk(&mut ev, &meta);
                ok = http::write_sse_event(&mut w, ev.as_bytes()).is_ok();
            }
            if !ok {
                return METRICS.record_status(499);
            }
        }
        let response = &mut bufs.response;
        let event = &mut bufs.event;
        let mut emitted_tokens = 0u32;
        let stats = generate(engine, sampler, tok, prompt, &gp, &mut |bytes| {
            emitted_tokens += 1;
            if emitted_tokens.is_multiple_of(4) {
                self.mark_engine_alive();
            }
            if peer_gone(stream) {
                return false;
            }
            if stream_mode {
                let mut ev = FixedBuf::new(event);
                let written = if *is_chat {
                    api::write_chat_chunk(&mut ev, &meta, &mut carry, bytes)
                } else {
                    api::write_completion_chunk(&mut ev, &meta, &mut carry, bytes)
                };
                written.is_ok()
                    && http::write_sse_event(&mut StdWriter(&mut *stream), ev.as_bytes()).is_ok()
            } else {
                let end = text_len + bytes.len();
                if end > response.len() {
                    return false;
                }
                response[text_len..end].copy_from_slice(bytes);
                text_len = end;
                true
            }
        });
        let stats = match stats {
            Ok(s) => s,
            Err(e) => return answer_error(stream, &ApiError::new(400, None, format_args!("{e}"))),
        };
        if stats.finish == FinishReason::Cancelled {
            crate::log_info!(
                "request {} cancelled after {} tokens: the client went away",
                *id,
                stats.generated_tokens
            );
            return METRICS.record_status(499);
        }
        let usage = Usage {
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.generated_tokens,
        };
        METRICS.record_generation(
            stats.prompt_tokens as u64,
            stats.generated_tokens as u64,
            stats.decode_tok_per_s(),
        );
        let mut w = StdWriter(&mut *stream);
        let sent = if stream_mode {
            let mut ev = FixedBuf::new(&mut bufs.event);
            let _ = if *is_chat {
                api::write_chat_final_chunk(&mut ev, &meta, &mut carry, stats.finish, Some(&usage))
            } else {
                api::write_completion_final_chunk(
                    &mut ev,
                    &meta,
                    &mut carry,
                    stats.finish,
                    Some(&usage),
                )
            };
            http::write_sse_event(&mut w, ev.as_bytes()).is_ok()
                && http::write_sse_done(&mut w).is_ok()
        } else {
            let mut out = FixedBuf::new(&mut bufs.json);
            let text = &bufs.response[..text_len];
            let _ = if *is_chat {
                api::write_chat_completion(&mut out, &meta, text, stats.finish, &usage)
            } else {
                api::write_completion(&mut out, &meta, text, stats.finish, &usage)
            };
            if out.overflowed() {
                answer_error(
                    stream,
                    &ApiError::server_error("the response did not fit its buffer"),
                );
                return;
            }
            let len = out.len();
            http::write_json(&mut w, 200, &bufs.json[..len]).is_ok()
        };
        METRICS.record_status(if sent { 200 } else { 499 });
        crate::log_info!(
            "request {} done: {} prompt tokens, {} generated, {} tok/s",
            *id,
            stats.prompt_tokens,
            stats.generated_tokens,
            stats.decode_tok_per_s() as u64
        );
    }
}
