//! The daemon's serving loop: one acceptor, a fixed set of client slots (one thread each, made at
//! boot), a fixed FIFO of requests, and one engine thread that decodes one request at a time.
//!
//! - The acceptor checks each peer's credentials (SO_PEERCRED) against the board's allowlist
//!   (403 otherwise), then hands the connection to a free slot, or answers 503 when every slot
//!   is busy.
//! - A slot thread reads the request into its fixed buffer under the read deadline (408),
//!   answers GETs and every malformed request itself, validates completions, and queues them;
//!   a full queue is a 503 at once.
//! - The engine thread (`super::job`) parses the queued request again into its own buffers,
//!   renders the chat template, tokenizes, decodes, and writes the response into the slot's
//!   [`Outbox`]; it never touches a socket. The slot thread sends the outbox to its client with
//!   a short limit per write. A client that hangs up is noticed within [`TICK`] and its
//!   generation cancelled; one that stops reading fills its outbox and is cancelled as one that
//!   could not keep up, after a short wait of the engine ([`KEEP_UP_LIMIT`]).
//! - Refusals (403, 503 for busy slots) never block the acceptor ([`super::refusal`]).
//! - The watchdog pings (`on_tick`) and `/health` follow the engine's progress: an engine that
//!   has shown no progress for [`ENGINE_STALL_LIMIT`] stops the pings and makes `/health` a 503
//!   with status "stalled".
//! - On shutdown the listener is closed at once (`on_stop_accepting` unlinks it), and running
//!   and queued requests end by the shutdown grace (finish_reason "length").
//!
//! After boot nothing here allocates: every buffer is made once in [`Server::new`] and
//! [`Server::run`].

use super::api::{self, ApiError};
use super::http::{self, Route};
use super::metrics::{render_prometheus, Metrics};
use super::outbox::{Outbox, Take};
use super::refusal::{Lingering, RateLimit};
use super::{resident, FixedBuf, StdWriter};
use crate::engine::sample::Sampler;
use crate::engine::Decoder;
use crate::tokenizer::chat::ChatFormat;
use crate::tokenizer::{EncodeScratch, Tokenizer};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The daemon's counters, for `GET /metrics`.
pub static METRICS: Metrics = Metrics::new();

/// How often idle threads look at the shutdown flag (and a slot at its client).
pub const TICK: Duration = Duration::from_millis(100);
/// How long an early answer waits for the client to finish sending before closing.
const LINGER: Duration = Duration::from_millis(200);
/// The longest the engine waits for room in one client's outbox; past it the client could not
/// keep up and its request is cancelled.
pub const KEEP_UP_LIMIT: Duration = Duration::from_secs(1);
/// The most the engine waits for one client's outbox over a whole request.
pub const KEEP_UP_BUDGET: Duration = Duration::from_secs(5);
/// A slot's limit on one write to its socket (it then looks at its outbox and the clock again).
const WRITE_SLICE: Duration = Duration::from_millis(100);
/// Bytes a slot moves from its outbox to its socket at once (the board's, as its budget counts).
const SEND_CHUNK: usize = crate::board::SEND_CHUNK_BYTES;
/// An engine that has shown no progress for this long is stalled: no watchdog pings, and
/// `/health` answers 503 "stalled". (A prefill is one step: it must fit in this.)
pub const ENGINE_STALL_LIMIT: Duration = Duration::from_secs(10);
/// At shutdown, how long after the grace a slot may still send an answer's end to a slow client.
const AFTER_GRACE: Duration = Duration::from_secs(5);
/// Refusal log lines: at most one per this.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

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
    /// After SIGTERM, the running and queued requests get at most this long to finish.
    pub shutdown_grace: Duration,
    /// Bytes of each slot's outbox (the response on its way to the client).
    pub output_buffer_bytes: usize,
    /// Set from the signal handler: stop accepting, finish the running request, return.
    pub shutdown: &'a (dyn Fn() -> bool + Sync),
    /// Called from the acceptor about every 100 ms while the engine is not stalled (watchdog
    /// pings).
    pub on_tick: &'a (dyn Fn() + Sync),
    /// Called once the listener is closed at shutdown (unlink the socket, tell systemd).
    pub on_stop_accepting: &'a (dyn Fn() + Sync),
    /// Heap allocations since boot finished, if the binary counts them (shown in `/metrics`).
    pub allocations: &'a (dyn Fn() -> Option<u64> + Sync),
    /// Called once every thread and buffer exists, before the first connection is accepted:
    /// boot is over (tell systemd READY=1, start counting allocations).
    pub on_ready: &'a (dyn Fn() + Sync),
}

/// A request handed from a slot thread to the engine thread.
pub(super) struct Job {
    pub(super) buf: Box<[u8]>,
    /// The body is `buf[body_start..body_end]`.
    pub(super) body_start: usize,
    pub(super) body_end: usize,
    pub(super) chat: bool,
    pub(super) id: u64,
}

/// One client slot: its thread, its buffers, and the hand-offs with the acceptor and engine.
pub(super) struct Slot {
    busy: AtomicBool,
    inbox: Mutex<Option<UnixStream>>,
    inbox_cv: Condvar,
    pub(super) job: Mutex<Job>,
    /// The slot thread's own text buffer, for validating a body before it is queued.
    text: Mutex<Box<[u8]>>,
    /// The response on its way from the engine to the client.
    pub(super) outbox: Outbox,
}

/// The FIFO of slot indices waiting for the engine.
pub(super) struct Queue {
    pub(super) q: Mutex<heapless::Deque<u16, 64>>,
    pub(super) cv: Condvar,
    depth: usize,
}

/// No shutdown seen yet (in `shutdown_at_ms`).
const NOT_YET: u64 = u64::MAX;

pub struct Server<'a> {
    pub(super) cfg: ServerConfig<'a>,
    pub(super) slots: Box<[Slot]>,
    pub(super) queue: Queue,
    next_id: AtomicU64,
    /// Milliseconds since `started` when the engine thread last showed life.
    engine_alive_ms: AtomicU64,
    started: Instant,
    /// Milliseconds since `started` when shutdown was first seen ([`NOT_YET`] before).
    shutdown_at_ms: AtomicU64,
    /// Threads that have started their loops (slots + engine).
    pub(super) threads_up: AtomicU64,
}

/// The engine thread's buffers, each sized once at boot.
pub(super) struct EngineBuffers {
    pub(super) text: Box<[u8]>,
    pub(super) prompt: Box<[u8]>,
    pub(super) tokens: Box<[u32]>,
    /// One piece of a response at a time (a head, an event, a piece of text), on its way to
    /// the outbox.
    pub(super) event: Box<[u8]>,
    pub(super) scratch: EncodeScratch,
}

pub(super) fn unix_now() -> u64 {
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
pub(super) fn peer_gone(stream: &UnixStream) -> bool {
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

/// Bytes the server allocates at boot, all of it before the first connection: per client slot
/// its request, the request's validated text, its output buffer and send chunk
/// (`board::slot_bytes`, what the board check counts); for the engine thread its text,
/// prompt, token and event buffers and the tokenizer's scratch for the longest prompt.
/// `leanstreamd` checks it against the board's `request_buffers` budget, whatever
/// `--max-clients` and `--output-buffer-kib` ask for.
pub fn memory_bytes(
    max_clients: usize,
    max_request_bytes: usize,
    output_buffer_bytes: usize,
    context: usize,
) -> usize {
    let slot = 2 * max_request_bytes + output_buffer_bytes.max(1) + SEND_CHUNK;
    let max_text = max_request_bytes;
    let prompt = max_text * 2 + 4096;
    let engine = max_text
        + prompt
        + context * std::mem::size_of::<u32>()
        + 4096
        + api::ERROR_BODY_MAX
        + EncodeScratch::new(prompt).memory_bytes();
    max_clients * slot + engine
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
                    buf: resident(cfg.max_request_bytes),
                    body_start: 0,
                    body_end: 0,
                    chat: false,
                    id: 0,
                }),
                text: Mutex::new(resident(cfg.max_request_bytes)),
                outbox: Outbox::new(cfg.output_buffer_bytes),
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
            shutdown_at_ms: AtomicU64::new(NOT_YET),
            threads_up: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub(super) fn mark_engine_alive(&self) {
        self.engine_alive_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Whether the engine has shown no progress for [`ENGINE_STALL_LIMIT`].
    pub(super) fn engine_stalled(&self) -> bool {
        let idle = self
            .now_ms()
            .saturating_sub(self.engine_alive_ms.load(Ordering::Relaxed));
        idle >= ENGINE_STALL_LIMIT.as_millis() as u64
    }

    /// Notes the moment shutdown was first seen (the start of the grace).
    pub(super) fn note_shutdown(&self) -> bool {
        if !(self.cfg.shutdown)() {
            return false;
        }
        let now = self.now_ms();
        let _ =
            self.shutdown_at_ms
                .compare_exchange(NOT_YET, now, Ordering::AcqRel, Ordering::Relaxed);
        true
    }

    /// When the shutdown grace ends, once shutdown was requested.
    pub(super) fn grace_deadline(&self) -> Option<Instant> {
        self.note_shutdown();
        match self.shutdown_at_ms.load(Ordering::Acquire) {
            NOT_YET => None,
            ms => Some(self.started + Duration::from_millis(ms) + self.cfg.shutdown_grace),
        }
    }

    pub(super) fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Serves until shutdown is requested, then lets the running request finish (bounded by
    /// `shutdown_grace`) and returns.
    pub fn run(
        &self,
        listener: UnixListener,
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

    fn accept_loop(&self, listener: UnixListener) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let _ = listener.set_nonblocking(true);
        let mut lingering = Lingering::new();
        let mut refusals = RateLimit::new(REFUSAL_LOG_EVERY);
        while !(self.cfg.shutdown)() {
            if !self.engine_stalled() {
                (self.cfg.on_tick)();
            }
            lingering.service(Instant::now());
            // Refused connections still draining are looked at again soon.
            let wait = if lingering.is_empty() { TICK } else { TICK / 5 };
            let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(wait.as_millis() as u16)) {
                Ok(0) | Err(_) => continue,
                Ok(_) => {}
            }
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(_) => continue,
            };
            let now = Instant::now();
            let allowed = match crate::sys::socket::peer_credentials(&stream) {
                Ok((uid, gid, pid)) => {
                    let ok = crate::sys::socket::peer_allowed(
                        uid,
                        gid,
                        self.cfg.allowed_uids,
                        self.cfg.allowed_gids,
                    );
                    if !ok {
                        if let Some(more) = refusals.admit(now) {
                            crate::log_warn!(
                                "refused peer uid {} gid {} pid {}: not on the allowlist ({} more refusals since the last line)",
                                uid,
                                gid,
                                pid,
                                more
                            );
                        }
                    }
                    ok
                }
                Err(_) => false,
            };
            if !allowed {
                METRICS.record_status(403);
                lingering.refuse(stream, &ApiError::forbidden(), now);
                continue;
            }
            let free = self.slots.iter().position(|s| {
                s.busy
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
            match free {
                Some(i) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_write_timeout(Some(self.cfg.read_timeout));
                    // The kernel's buffer for this client stays about the size of its outbox.
                    let _ = nix::sys::socket::setsockopt(
                        &stream,
                        nix::sys::socket::sockopt::SndBuf,
                        &self.cfg.output_buffer_bytes,
                    );
                    let slot = &self.slots[i];
                    *slot.inbox.lock().unwrap() = Some(stream);
                    slot.inbox_cv.notify_one();
                }
                None => {
                    METRICS.record_status(503);
                    if let Some(more) = refusals.admit(now) {
                        crate::log_warn!(
                            "all {} client slots busy: answered 503 ({} more refusals since the last line)",
                            self.slots.len(),
                            more
                        );
                    }
                    lingering.refuse(stream, &ApiError::queue_full(), now);
                }
            }
        }
        self.note_shutdown();
        // New clients get ECONNREFUSED (then ENOENT) rather than a connection nobody serves.
        drop(listener);
        drop(lingering);
        (self.cfg.on_stop_accepting)();
        crate::log_info!("shutdown requested: no longer accepting connections");
        // Wake everyone so they see the flag.
        self.queue.cv.notify_all();
        for s in self.slots.iter() {
            s.inbox_cv.notify_all();
        }
    }

    fn slot_loop(&self, i: usize) {
        let slot = &self.slots[i];
        let mut chunk = resident::<u8>(SEND_CHUNK);
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
            self.serve_connection(slot, i, stream, &mut chunk);
            METRICS.active_clients.fetch_sub(1, Ordering::Relaxed);
            slot.busy.store(false, Ordering::Release);
        }
    }

    /// Reads one request, answers what needs no engine, queues the rest and waits for it.
    fn serve_connection(
        &self,
        slot: &Slot,
        index: usize,
        mut stream: UnixStream,
        chunk: &mut [u8],
    ) {
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
                Ok(0) if len == 0 => {
                    // The client closed without sending anything: nobody to answer.
                    METRICS.record_status(499);
                    return;
                }
                Ok(0) => {
                    // The client ended its side (or went away) before the whole request.
                    let e = match head {
                        Some(h) => ApiError::new(
                            400,
                            None,
                            format_args!(
                                "the request body ended after {} of its {} bytes (Content-Length)",
                                len - h.head_len,
                                h.content_length.unwrap_or(0)
                            ),
                        ),
                        None => ApiError::bad_request("the request ended before its head did"),
                    };
                    return answer_error(&mut stream, &e);
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
        job.body_start = body.start;
        job.body_end = body.end;
        job.chat = chat;
        job.id = self.next_request_id();
        let id = job.id;
        drop(job);
        slot.outbox.reset();
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
            return answer_error(&mut stream, &ApiError::queue_full());
        }
        self.queue.cv.notify_one();
        self.send_outbox(slot, id, &mut stream, chunk);
    }

    /// Sends what the engine puts in the slot's outbox until it finishes, then counts the
    /// response. A client that goes away, or stops reading for the read timeout, closes the
    /// outbox (the engine then stops generating for it).
    fn send_outbox(&self, slot: &Slot, id: u64, stream: &mut UnixStream, chunk: &mut [u8]) {
        let _ = stream.set_write_timeout(Some(WRITE_SLICE));
        let mut delivered = true;
        let mut progress: Instant;
        'send: loop {
            let n = match slot.outbox.take(chunk, TICK) {
                Take::Bytes(n) => n,
                Take::Idle => {
                    if peer_gone(stream) {
                        delivered = false;
                        break;
                    }
                    continue;
                }
                Take::Finished => break,
                Take::Aborted => {
                    delivered = false;
                    break;
                }
            };
            // The client has the read timeout to take each chunk (not counting the time the
            // engine took to make it).
            progress = Instant::now();
            let mut sent = 0;
            while sent < n {
                match stream.write(&chunk[sent..n]) {
                    Ok(0) => {
                        delivered = false;
                        break 'send;
                    }
                    Ok(k) => {
                        sent += k;
                        progress = Instant::now();
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        if slot.outbox.is_aborted() {
                            delivered = false;
                            break 'send;
                        }
                        // Past the grace at shutdown, a client that is still behind is left.
                        let limit = match self.grace_deadline() {
                            Some(d) if Instant::now() > d + AFTER_GRACE => Duration::ZERO,
                            _ => self.cfg.read_timeout,
                        };
                        if progress.elapsed() >= limit {
                            METRICS.slow_clients_total.fetch_add(1, Ordering::Relaxed);
                            crate::log_info!(
                                "request {} cut off: the client could not keep up (it stopped reading)",
                                id
                            );
                            delivered = false;
                            break 'send;
                        }
                    }
                    Err(_) => {
                        delivered = false;
                        break 'send;
                    }
                }
            }
        }
        if !delivered {
            slot.outbox.close();
        }
        let status = slot.outbox.wait_finished(TICK);
        METRICS.record_status(if delivered { status } else { 499 });
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }

    fn answer_get(&self, stream: &mut UnixStream, route: Route, buf: &mut [u8]) {
        let mut body = FixedBuf::new(buf);
        // One look, so the status line and the body agree.
        let stalled = route == Route::Health && self.engine_stalled();
        let content_type = match route {
            Route::Health => {
                let _ = api::write_health(&mut body, self.cfg.model_name, stalled);
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
            let status = if stalled { 503 } else { 200 };
            let _ = http::write_response(
                &mut StdWriter(&mut *stream),
                status,
                content_type,
                &buf[..len],
            );
            METRICS.record_status(status);
        } else {
            answer_error(stream, &ApiError::server_error("response too large"));
        }
    }
}
