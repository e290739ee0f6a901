//! Logging with defmt's deferred-formatting idea, on hosted Linux.
//!
//! # Why not defmt itself
//!
//! [defmt](https://github.com/knurling-rs/defmt) interns format strings into a
//! dedicated ELF section placed by its linker script (`defmt.x`, which the
//! application must pass with `-C link-arg=-Tdefmt.x`), encodes each log call
//! as a binary frame (string index + raw arguments), and hands the frames to
//! exactly one "global logger" transport (RTT, ITM, semihosting) for a *host*
//! decoder (`defmt-print`, probe-rs) that reads the ELF to turn them back into
//! text. A hosted Linux daemon has none of those pieces: its "host" is the
//! journal, which stores text lines written to stderr, and nobody would run a
//! decoder against the binary next to `journalctl`. Injecting a custom linker
//! script into a normal `std` Linux link is also not a supported setup
//! (upstream issue knurling-rs/defmt#463, "Support non-embedded targets", is
//! open and notes that modifying the linker script "is not as practical" on
//! Linux).
//!
//! # What we keep
//!
//! The cheap part of the idea: the hot path does not format. A log call copies
//! `(level, &'static str format, up to 4 scalar or &'static str arguments,
//! timestamp)` into a fixed ring of [`RING_CAPACITY`] records in a `static`
//! (no allocation, one uncontended mutex, a condvar poke). A logger thread,
//! started once at boot by [`start_logger`], formats the records and writes
//! them to stderr as `<N>[uptime] message`, with sd-daemon priority prefixes
//! (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug) that journald turns
//! into the record's priority. When the ring is full the oldest record is
//! overwritten and counted; the logger reports the count.
//!
//! Arguments are `Copy` scalars or `&'static str` only, so request data (and
//! in particular prompt text, which is never `'static`) cannot reach the log
//! through the macros by construction. Prompts go through [`log_prompt`], which
//! writes nothing unless [`set_log_prompts`] turned it on.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Records the ring holds before the oldest is dropped.
pub const RING_CAPACITY: usize = 256;
/// Most arguments one log call may carry (checked at compile time by the macros).
pub const MAX_ARGS: usize = 4;

/// Severity, numbered as syslog/sd-daemon priorities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 3,
    Warn = 4,
    Info = 6,
    Debug = 7,
}

/// One deferred argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    U(u64),
    I(i64),
    F(f64),
    Bool(bool),
    Str(&'static str),
}

macro_rules! arg_from {
    ($variant:ident, $as:ty: $($t:ty),*) => {
        $(impl From<$t> for Arg {
            #[inline]
            fn from(v: $t) -> Arg {
                Arg::$variant(v as $as)
            }
        })*
    };
}
arg_from!(U, u64: u8, u16, u32, u64, usize);
arg_from!(I, i64: i8, i16, i32, i64, isize);
arg_from!(F, f64: f32, f64);

impl From<bool> for Arg {
    #[inline]
    fn from(v: bool) -> Arg {
        Arg::Bool(v)
    }
}

impl From<&'static str> for Arg {
    #[inline]
    fn from(v: &'static str) -> Arg {
        Arg::Str(v)
    }
}

/// One log call, as stored in the ring.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub level: Level,
    pub format: &'static str,
    pub args: [Arg; MAX_ARGS],
    pub nargs: u8,
    /// Microseconds since the logger's epoch (first log call or [`start_logger`]).
    pub micros: u64,
}

impl Record {
    const EMPTY: Record = Record {
        level: Level::Debug,
        format: "",
        args: [Arg::U(0); MAX_ARGS],
        nargs: 0,
        micros: 0,
    };

    /// Builds a record; arguments past [`MAX_ARGS`] are ignored (the macros
    /// make that a compile error).
    pub fn new(level: Level, format: &'static str, args: &[Arg], micros: u64) -> Record {
        let mut r = Record {
            level,
            format,
            micros,
            ..Record::EMPTY
        };
        let n = args.len().min(MAX_ARGS);
        r.args[..n].copy_from_slice(&args[..n]);
        r.nargs = n as u8;
        r
    }

    /// Appends `<N>[    s.micros] message` (no newline) to `out`. `{}` takes
    /// the next argument, `{{` and `}}` are literal braces; a `{}` without an
    /// argument prints `{?}`.
    pub fn format_into(&self, out: &mut String) {
        let _ = write!(
            out,
            "<{}>[{:5}.{:06}] ",
            self.level as u8,
            self.micros / 1_000_000,
            self.micros % 1_000_000
        );
        let mut next = 0usize;
        let mut rest = self.format;
        while let Some(i) = rest.find(['{', '}']) {
            out.push_str(&rest[..i]);
            let tail = &rest[i..];
            if tail.starts_with("{{") || tail.starts_with("}}") {
                out.push_str(&tail[..1]);
                rest = &tail[2..];
            } else if let Some(after) = tail.strip_prefix("{}") {
                if next < self.nargs as usize {
                    push_arg(out, self.args[next]);
                } else {
                    out.push_str("{?}");
                }
                next += 1;
                rest = after;
            } else {
                out.push_str(&tail[..1]);
                rest = &tail[1..];
            }
        }
        out.push_str(rest);
    }
}

fn push_arg(out: &mut String, a: Arg) {
    let _ = match a {
        Arg::U(v) => write!(out, "{v}"),
        Arg::I(v) => write!(out, "{v}"),
        Arg::F(v) => write!(out, "{v:.3}"),
        Arg::Bool(v) => write!(out, "{v}"),
        Arg::Str(s) => {
            out.push_str(s);
            Ok(())
        }
    };
}

/// Number of `{}` placeholders in a format string (`{{`/`}}` excluded).
/// `const` so the macros can check the argument count at compile time.
pub const fn count_placeholders(fmt: &str) -> usize {
    let b = fmt.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        if i + 1 < b.len()
            && ((b[i] == b'{' && b[i + 1] == b'{') || (b[i] == b'}' && b[i + 1] == b'}'))
        {
            i += 2;
        } else if i + 1 < b.len() && b[i] == b'{' && b[i + 1] == b'}' {
            n += 1;
            i += 2;
        } else {
            i += 1;
        }
    }
    n
}

struct RingState {
    buf: [Record; RING_CAPACITY],
    /// Index of the oldest record.
    head: usize,
    len: usize,
    /// Records overwritten since the last report.
    dropped: u64,
    /// Records overwritten since boot.
    dropped_total: u64,
}

/// A fixed ring of records. The daemon uses the one [`static`](RING) instance;
/// tests make their own.
pub struct LogRing {
    state: Mutex<RingState>,
    ready: Condvar,
}

impl Default for LogRing {
    fn default() -> Self {
        Self::new()
    }
}

impl LogRing {
    pub const fn new() -> LogRing {
        LogRing {
            state: Mutex::new(RingState {
                buf: [Record::EMPTY; RING_CAPACITY],
                head: 0,
                len: 0,
                dropped: 0,
                dropped_total: 0,
            }),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RingState> {
        // A panic while holding this lock cannot leave the ring inconsistent
        // (plain index updates), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a record, overwriting the oldest when full. Does not allocate.
    pub fn push(&self, r: Record) {
        {
            let mut s = self.lock();
            if s.len == RING_CAPACITY {
                let head = s.head;
                s.buf[head] = r;
                s.head = (head + 1) % RING_CAPACITY;
                s.dropped += 1;
                s.dropped_total += 1;
            } else {
                let tail = (s.head + s.len) % RING_CAPACITY;
                s.buf[tail] = r;
                s.len += 1;
            }
        }
        self.ready.notify_one();
    }

    /// Moves up to `out.len()` oldest records into `out`; returns how many,
    /// and the drops since the last call.
    pub fn pop_batch(&self, out: &mut [Record]) -> (usize, u64) {
        let mut s = self.lock();
        Self::take(&mut s, out)
    }

    fn take(s: &mut RingState, out: &mut [Record]) -> (usize, u64) {
        let n = s.len.min(out.len());
        for slot in out.iter_mut().take(n) {
            *slot = s.buf[s.head];
            s.head = (s.head + 1) % RING_CAPACITY;
        }
        s.len -= n;
        let dropped = std::mem::take(&mut s.dropped);
        (n, dropped)
    }

    /// Blocks until there is something to write (records or a drop report).
    fn wait_for_records(&self) {
        let mut s = self.lock();
        while s.len == 0 && s.dropped == 0 {
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Records currently waiting.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records dropped since boot.
    pub fn dropped_total(&self) -> u64 {
        self.lock().dropped_total
    }

    /// Formats everything waiting and writes it to `w`, one line per record,
    /// preceded by a warning line if records were dropped. Returns the number
    /// of records written. (Allocates: this is the logger side.)
    pub fn drain_to(&self, w: &mut dyn Write) -> io::Result<usize> {
        let mut batch = [Record::EMPTY; 32];
        let mut line = String::with_capacity(256);
        let mut total = 0;
        loop {
            let (n, dropped) = self.pop_batch(&mut batch);
            write_batch(w, &batch[..n], dropped, &mut line)?;
            total += n;
            if n < batch.len() {
                return Ok(total);
            }
        }
    }
}

fn write_batch(
    w: &mut dyn Write,
    recs: &[Record],
    dropped: u64,
    line: &mut String,
) -> io::Result<()> {
    line.clear();
    if dropped > 0 {
        let _ = writeln!(
            line,
            "<4>log: {dropped} records dropped (ring of {RING_CAPACITY} full)"
        );
    }
    for r in recs {
        r.format_into(line);
        line.push('\n');
    }
    if !line.is_empty() {
        w.write_all(line.as_bytes())?;
        w.flush()?;
    }
    Ok(())
}

/// The daemon's ring.
pub static RING: LogRing = LogRing::new();
static MAX_LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static LOG_PROMPTS: AtomicBool = AtomicBool::new(false);
static STARTED: AtomicBool = AtomicBool::new(false);
static EPOCH: OnceLock<Instant> = OnceLock::new();
/// Serializes writers (logger thread and [`flush`]) so lines stay in order.
static WRITER: Mutex<()> = Mutex::new(());

/// Sets the most verbose level recorded (default [`Level::Info`]).
pub fn set_max_level(level: Level) {
    MAX_LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether a record at `level` would be kept.
#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= MAX_LEVEL.load(Ordering::Relaxed)
}

/// The hot path behind the macros: filters by level, stamps the time and
/// pushes into [`RING`]. Does not allocate or format.
#[inline]
pub fn record(level: Level, format: &'static str, args: &[Arg]) {
    if !enabled(level) {
        return;
    }
    let epoch = *EPOCH.get_or_init(Instant::now);
    let micros = epoch.elapsed().as_micros() as u64;
    RING.push(Record::new(level, format, args, micros));
}

/// Starts the logger thread that drains [`RING`] to stderr (journald
/// captures it). Idempotent; call once at boot, before the first request.
pub fn start_logger() -> io::Result<()> {
    EPOCH.get_or_init(Instant::now);
    if STARTED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let spawned = std::thread::Builder::new().name("log".into()).spawn(|| {
        let mut batch = [Record::EMPTY; 32];
        let mut line = String::with_capacity(4096);
        loop {
            RING.wait_for_records();
            let _w = WRITER.lock().unwrap_or_else(|p| p.into_inner());
            let (n, dropped) = RING.pop_batch(&mut batch);
            // stderr failing (closed journal stream) leaves nowhere to report to.
            let _ = write_batch(&mut io::stderr().lock(), &batch[..n], dropped, &mut line);
        }
    });
    if let Err(e) = spawned {
        STARTED.store(false, Ordering::SeqCst);
        return Err(e);
    }
    Ok(())
}

/// Writes everything still in the ring to stderr from the calling thread.
/// Call on shutdown, after the last log call.
pub fn flush() {
    let _w = WRITER.lock().unwrap_or_else(|p| p.into_inner());
    let _ = RING.drain_to(&mut io::stderr().lock());
}

/// Turns prompt logging on or off (debug flag; default off).
pub fn set_log_prompts(on: bool) {
    LOG_PROMPTS.store(on, Ordering::Relaxed);
}

/// Whether [`set_log_prompts`] turned prompt logging on.
pub fn log_prompts() -> bool {
    LOG_PROMPTS.load(Ordering::Relaxed)
}

/// Logs a request's prompt at debug priority, **only** if [`set_log_prompts`]
/// turned it on; otherwise does nothing and returns `false`. The text is
/// escaped (newlines, control characters) so it stays one journal line. This
/// bypasses the ring and allocates: it is a debugging aid, off in production.
pub fn log_prompt(request_id: u64, prompt: &str) -> bool {
    if !log_prompts() {
        return false;
    }
    let _ = write_prompt(&mut io::stderr().lock(), request_id, prompt);
    true
}

/// The line [`log_prompt`] writes, to any writer.
pub fn write_prompt(w: &mut dyn Write, request_id: u64, prompt: &str) -> io::Result<()> {
    let mut line = String::with_capacity(prompt.len() + 32);
    let _ = write!(line, "<7>request {request_id} prompt: \"");
    for c in prompt.chars() {
        match c {
            '"' => line.push_str("\\\""),
            '\\' => line.push_str("\\\\"),
            c if c.is_control() => line.extend(c.escape_default()),
            c => line.push(c),
        }
    }
    line.push_str("\"\n");
    w.write_all(line.as_bytes())
}

/// Records a log call with up to 4 arguments; the placeholder count is
/// checked against the arguments at compile time.
#[macro_export]
macro_rules! log_at {
    ($level:expr, $fmt:literal $(, $arg:expr)* $(,)?) => {{
        const _: () = {
            let n = $crate::sys::log::count_placeholders($fmt);
            let a = $crate::log_at!(@count $($arg),*);
            assert!(n == a, "log: the format's placeholder count differs from the argument count");
            assert!(a <= $crate::sys::log::MAX_ARGS, "log: at most 4 arguments");
        };
        $crate::sys::log::record($level, $fmt, &[$($crate::sys::log::Arg::from($arg)),*]);
    }};
    (@count) => { 0usize };
    (@count $head:expr $(, $tail:expr)*) => { 1usize + $crate::log_at!(@count $($tail),*) };
}

/// `log_error!("load failed: {}", code)`: priority 3.
#[macro_export]
macro_rules! log_error {
    ($($t:tt)*) => { $crate::log_at!($crate::sys::log::Level::Error, $($t)*) };
}

/// `log_warn!(...)`: priority 4.
#[macro_export]
macro_rules! log_warn {
    ($($t:tt)*) => { $crate::log_at!($crate::sys::log::Level::Warn, $($t)*) };
}

/// `log_info!("request {} done: {} tokens", id, n)`: priority 6.
#[macro_export]
macro_rules! log_info {
    ($($t:tt)*) => { $crate::log_at!($crate::sys::log::Level::Info, $($t)*) };
}

/// `log_debug!(...)`: priority 7 (kept only after `set_max_level(Level::Debug)`).
#[macro_export]
macro_rules! log_debug {
    ($($t:tt)*) => { $crate::log_at!($crate::sys::log::Level::Debug, $($t)*) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(r: &Record) -> String {
        let mut s = String::new();
        r.format_into(&mut s);
        s
    }

    #[test]
    fn records_format_with_priority_prefix() {
        let r = Record::new(
            Level::Info,
            "request {} done: {} tokens",
            &[Arg::from(7u64), Arg::from(42usize)],
            1_500_000,
        );
        assert_eq!(fmt(&r), "<6>[    1.500000] request 7 done: 42 tokens");
        let r = Record::new(
            Level::Error,
            "{} {} {} {}",
            &[
                Arg::from(-3i32),
                Arg::from(2.5f32),
                Arg::from("kv"),
                Arg::from(true),
            ],
            0,
        );
        assert_eq!(fmt(&r), "<3>[    0.000000] -3 2.500 kv true");
        let r = Record::new(Level::Warn, "{{literal}} {} {}", &[Arg::U(1)], 0);
        assert_eq!(fmt(&r), "<4>[    0.000000] {literal} 1 {?}");
        assert!(fmt(&Record::new(Level::Debug, "x", &[], 0)).starts_with("<7>"));
    }

    #[test]
    fn placeholder_count() {
        assert_eq!(count_placeholders("a {} b {} {{}} }}"), 2);
        assert_eq!(count_placeholders(""), 0);
        assert_eq!(count_placeholders("{"), 0);
    }

    #[test]
    fn overflow_drops_oldest_and_counts() {
        let ring = LogRing::new();
        for i in 0..(RING_CAPACITY as u64 + 10) {
            ring.push(Record::new(Level::Info, "n={}", &[Arg::U(i)], 0));
        }
        assert_eq!(ring.len(), RING_CAPACITY);
        assert_eq!(ring.dropped_total(), 10);
        let mut out = Vec::new();
        assert_eq!(ring.drain_to(&mut out).unwrap(), RING_CAPACITY);
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "<4>log: 10 records dropped (ring of 256 full)"
        );
        assert!(
            lines.next().unwrap().ends_with("n=10"),
            "oldest kept is #10"
        );
        assert!(text
            .trim_end()
            .ends_with(&format!("n={}", RING_CAPACITY + 9)));
        assert!(ring.is_empty());
        // The drop report is given once.
        let mut out = Vec::new();
        assert_eq!(ring.drain_to(&mut out).unwrap(), 0);
        assert!(out.is_empty());
    }

    #[test]
    fn prompt_logging_is_off_by_default_and_escaped() {
        // Only this test touches the flag.
        assert!(!log_prompts());
        assert!(!log_prompt(1, "secret"));
        let mut out = Vec::new();
        write_prompt(&mut out, 9, "a \"b\"\nc\\").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "<7>request 9 prompt: \"a \\\"b\\\"\\nc\\\\\"\n"
        );
        set_log_prompts(true);
        assert!(log_prompts());
        set_log_prompts(false);
    }

    #[test]
    fn macros_record_into_the_global_ring() {
        // Other tests don't use the global ring, so this one may count on it.
        set_max_level(Level::Info);
        let before = RING.len();
        crate::log_info!("request {} done: {} tokens", 3u64, 12u32);
        crate::log_warn!("no args");
        crate::log_debug!("filtered {}", 1u8);
        assert_eq!(RING.len(), before + 2);
        let mut out = Vec::new();
        RING.drain_to(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("] request 3 done: 12 tokens\n"), "{text}");
        assert!(text.contains("<4>["), "{text}");
        assert!(!text.contains("filtered"));
    }
}
