//! Server counters, updated lock-free from any thread, and their Prometheus text for
//! `GET /metrics`. A `static METRICS: Metrics = Metrics::new();` needs no allocation.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The statuses counted one by one; any other is counted under status 0 ("other").
pub const STATUSES: [u16; 15] = [
    200, 400, 403, 404, 405, 408, 411, 413, 422, 431, 500, 503, 505, 499, 0,
];

/// Upper bounds (seconds) of the time-to-first-token histogram's buckets; +Inf is implied.
pub const TTFT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The counters. Counters only grow; gauges (`decode_tok_per_s`, `queue_depth`,
/// `active_clients`) are set.
pub struct Metrics {
    /// Responses by status, in the order of [`STATUSES`] (499: the client closed first, or could
    /// not keep up and was cut off).
    pub requests_by_status: [(u16, AtomicU64); STATUSES.len()],
    pub prompt_tokens_total: AtomicU64,
    pub completion_tokens_total: AtomicU64,
    /// Decode speed of the last finished request, tokens per second, as `f64::to_bits`.
    pub decode_tok_per_s_bits: AtomicU64,
    /// Requests waiting for the engine.
    pub queue_depth: AtomicU64,
    /// 503s: the queue was full.
    pub rejections_total: AtomicU64,
    /// 403s: the peer's uid/gid is not allowed.
    pub peer_rejections_total: AtomicU64,
    /// Connections being served.
    pub active_clients: AtomicU64,
    /// Requests cancelled because their client could not keep up with the output.
    pub slow_clients_total: AtomicU64,
    /// The streamed FFN since boot (all zero when the FFN is not streamed): tokens, cache hits
    /// and misses, bytes read from the SSD, and nanoseconds the decode waited for reads.
    pub ffn_tokens_total: AtomicU64,
    pub ffn_cache_hits_total: AtomicU64,
    pub ffn_cache_misses_total: AtomicU64,
    pub ffn_bytes_read_total: AtomicU64,
    pub ffn_io_wait_ns_total: AtomicU64,
    /// Time to first token: requests whose first token took at most each of [`TTFT_BUCKETS`]
    /// (not cumulative here; the text adds them up), then over the last; their count and the
    /// sum of their times in microseconds.
    pub ttft_buckets: [AtomicU64; TTFT_BUCKETS.len() + 1],
    pub ttft_count: AtomicU64,
    pub ttft_sum_us: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub const fn new() -> Self {
        let mut by_status = [const { (0u16, AtomicU64::new(0)) }; STATUSES.len()];
        let mut i = 0;
        while i < STATUSES.len() {
            by_status[i].0 = STATUSES[i];
            i += 1;
        }
        Metrics {
            requests_by_status: by_status,
            prompt_tokens_total: AtomicU64::new(0),
            completion_tokens_total: AtomicU64::new(0),
            decode_tok_per_s_bits: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            rejections_total: AtomicU64::new(0),
            peer_rejections_total: AtomicU64::new(0),
            active_clients: AtomicU64::new(0),
            slow_clients_total: AtomicU64::new(0),
            ffn_tokens_total: AtomicU64::new(0),
            ffn_cache_hits_total: AtomicU64::new(0),
            ffn_cache_misses_total: AtomicU64::new(0),
            ffn_bytes_read_total: AtomicU64::new(0),
            ffn_io_wait_ns_total: AtomicU64::new(0),
            ttft_buckets: [const { AtomicU64::new(0) }; TTFT_BUCKETS.len() + 1],
            ttft_count: AtomicU64::new(0),
            ttft_sum_us: AtomicU64::new(0),
        }
    }

    /// Counts one request's time to first token: from the engine taking the request to its
    /// first token (the prompt's prefill and one sample; time queued is not in it).
    pub fn record_ttft(&self, secs: f64) {
        let slot = TTFT_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(TTFT_BUCKETS.len());
        self.ttft_buckets[slot].fetch_add(1, Relaxed);
        self.ttft_count.fetch_add(1, Relaxed);
        self.ttft_sum_us
            .fetch_add((secs.max(0.0) * 1e6) as u64, Relaxed);
    }

    /// Sets the streamed FFN's totals (the engine's counters since boot).
    pub fn record_stream(&self, s: &crate::engine::StreamStats) {
        self.ffn_tokens_total.store(s.tokens, Relaxed);
        self.ffn_cache_hits_total.store(s.cache.hits, Relaxed);
        self.ffn_cache_misses_total.store(s.cache.misses, Relaxed);
        self.ffn_bytes_read_total.store(s.cache.bytes_read, Relaxed);
        self.ffn_io_wait_ns_total.store(s.io_wait_ns, Relaxed);
    }

    /// Counts one response with `status` (503s and 403s also count as rejections).
    pub fn record_status(&self, status: u16) {
        let slot = self
            .requests_by_status
            .iter()
            .find(|(s, _)| *s == status)
            .unwrap_or(&self.requests_by_status[STATUSES.len() - 1]);
        slot.1.fetch_add(1, Relaxed);
        match status {
            503 => {
                self.rejections_total.fetch_add(1, Relaxed);
            }
            403 => {
                self.peer_rejections_total.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    /// Adds a finished request's token counts and sets the decode-speed gauge.
    pub fn record_generation(&self, prompt_tokens: u64, completion_tokens: u64, tok_per_s: f64) {
        self.prompt_tokens_total.fetch_add(prompt_tokens, Relaxed);
        self.completion_tokens_total
            .fetch_add(completion_tokens, Relaxed);
        self.decode_tok_per_s_bits
            .store(tok_per_s.to_bits(), Relaxed);
    }

    pub fn decode_tok_per_s(&self) -> f64 {
        f64::from_bits(self.decode_tok_per_s_bits.load(Relaxed))
    }
}

fn family(out: &mut impl Write, name: &str, kind: &str, help: &str) -> fmt::Result {
    write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n")
}

/// Writes the Prometheus text exposition format (version 0.0.4).
pub fn render_prometheus(m: &Metrics, out: &mut impl Write) -> fmt::Result {
    let name = "leanstream_requests_total";
    family(out, name, "counter", "HTTP responses by status (0: other).")?;
    for (status, n) in &m.requests_by_status {
        writeln!(out, "{name}{{status=\"{status}\"}} {}", n.load(Relaxed))?;
    }
    let counters = [
        (
            "leanstream_prompt_tokens_total",
            "Prompt tokens processed.",
            &m.prompt_tokens_total,
        ),
        (
            "leanstream_completion_tokens_total",
            "Tokens generated.",
            &m.completion_tokens_total,
        ),
        (
            "leanstream_rejections_total",
            "Requests refused with 503 because the queue was full.",
            &m.rejections_total,
        ),
        (
            "leanstream_peer_rejections_total",
            "Connections refused with 403 because of the peer's uid/gid.",
            &m.peer_rejections_total,
        ),
        (
            "leanstream_slow_clients_total",
            "Requests cancelled because the client could not keep up with the output.",
            &m.slow_clients_total,
        ),
        (
            "leanstream_ffn_tokens_total",
            "Tokens decoded with the FFN streamed from the flash image.",
            &m.ffn_tokens_total,
        ),
        (
            "leanstream_ffn_cache_hits_total",
            "FFN blocks a token needed that were in the weight cache.",
            &m.ffn_cache_hits_total,
        ),
        (
            "leanstream_ffn_cache_misses_total",
            "FFN blocks a token needed that were read from the SSD.",
            &m.ffn_cache_misses_total,
        ),
        (
            "leanstream_ffn_bytes_read_total",
            "Bytes of FFN blocks read from the SSD.",
            &m.ffn_bytes_read_total,
        ),
        (
            "leanstream_ffn_io_wait_nanoseconds_total",
            "Time decoding waited for FFN block reads.",
            &m.ffn_io_wait_ns_total,
        ),
    ];
    for (name, help, v) in counters {
        family(out, name, "counter", help)?;
        writeln!(out, "{name} {}", v.load(Relaxed))?;
    }
    let gauges = [
        (
            "leanstream_queue_depth",
            "Requests waiting for the engine.",
            &m.queue_depth,
        ),
        (
            "leanstream_active_clients",
            "Connections being served.",
            &m.active_clients,
        ),
    ];
    for (name, help, v) in gauges {
        family(out, name, "gauge", help)?;
        writeln!(out, "{name} {}", v.load(Relaxed))?;
    }
    // The streamed FFN's ratios since boot (0 before any streamed token).
    let tokens = m.ffn_tokens_total.load(Relaxed);
    let (hits, misses) = (
        m.ffn_cache_hits_total.load(Relaxed),
        m.ffn_cache_misses_total.load(Relaxed),
    );
    let per_token = |v: u64| {
        if tokens == 0 {
            0.0
        } else {
            v as f64 / tokens as f64
        }
    };
    let ratios = [
        (
            "leanstream_ffn_cache_hit_ratio",
            "Share of needed FFN blocks found in the weight cache, since boot.",
            if hits + misses == 0 {
                0.0
            } else {
                hits as f64 / (hits + misses) as f64
            },
        ),
        (
            "leanstream_ffn_bytes_read_per_token",
            "FFN bytes read from the SSD per decoded token, since boot.",
            per_token(m.ffn_bytes_read_total.load(Relaxed)),
        ),
        (
            "leanstream_ffn_io_wait_seconds_per_token",
            "Time waiting for FFN reads per decoded token, since boot.",
            per_token(m.ffn_io_wait_ns_total.load(Relaxed)) / 1e9,
        ),
    ];
    for (name, help, v) in ratios {
        family(out, name, "gauge", help)?;
        writeln!(out, "{name} {v}")?;
    }
    let name = "leanstream_time_to_first_token_seconds";
    family(
        out,
        name,
        "histogram",
        "From the engine taking a request to its first token (prefill; queueing not included).",
    )?;
    let mut below = 0;
    for (i, le) in TTFT_BUCKETS.iter().enumerate() {
        below += m.ttft_buckets[i].load(Relaxed);
        writeln!(out, "{name}_bucket{{le=\"{le}\"}} {below}")?;
    }
    below += m.ttft_buckets[TTFT_BUCKETS.len()].load(Relaxed);
    writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {below}")?;
    let sum = m.ttft_sum_us.load(Relaxed) as f64 / 1e6;
    writeln!(out, "{name}_sum {sum}")?;
    writeln!(out, "{name}_count {}", m.ttft_count.load(Relaxed))?;
    let name = "leanstream_decode_tokens_per_second";
    family(
        out,
        name,
        "gauge",
        "Decode speed of the last finished request.",
    )?;
    let v = m.decode_tok_per_s();
    if v.is_finite() {
        writeln!(out, "{name} {v}")
    } else {
        writeln!(out, "{name} NaN")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::FixedBuf;

    static METRICS: Metrics = Metrics::new();

    #[test]
    fn prometheus_text() {
        let m = &METRICS;
        m.record_status(200);
        m.record_status(200);
        m.record_status(503);
        m.record_status(403);
        m.record_status(418);
        m.record_status(422);
        m.slow_clients_total.fetch_add(1, Relaxed);
        m.record_generation(10, 20, 12.5);
        m.record_ttft(0.03);
        m.record_ttft(0.004);
        m.record_ttft(42.0);
        m.queue_depth.store(3, Relaxed);
        m.active_clients.store(2, Relaxed);
        let mut b = [0u8; 8192];
        let mut f = FixedBuf::new(&mut b);
        render_prometheus(m, &mut f).unwrap();
        let s = f.as_str();
        for line in [
            "# HELP leanstream_requests_total HTTP responses by status (0: other).",
            "# TYPE leanstream_requests_total counter",
            "leanstream_requests_total{status=\"200\"} 2",
            "leanstream_requests_total{status=\"503\"} 1",
            "leanstream_requests_total{status=\"404\"} 0",
            "leanstream_requests_total{status=\"0\"} 1",
            "leanstream_requests_total{status=\"422\"} 1",
            "leanstream_slow_clients_total 1",
            "leanstream_prompt_tokens_total 10",
            "leanstream_completion_tokens_total 20",
            "leanstream_rejections_total 1",
            "leanstream_peer_rejections_total 1",
            "# TYPE leanstream_queue_depth gauge",
            "leanstream_queue_depth 3",
            "leanstream_active_clients 2",
            "# TYPE leanstream_decode_tokens_per_second gauge",
            "leanstream_decode_tokens_per_second 12.5",
            "# TYPE leanstream_time_to_first_token_seconds histogram",
            "leanstream_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
            "leanstream_time_to_first_token_seconds_bucket{le=\"0.025\"} 1",
            "leanstream_time_to_first_token_seconds_bucket{le=\"0.05\"} 2",
            "leanstream_time_to_first_token_seconds_bucket{le=\"10\"} 2",
            "leanstream_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3",
            "leanstream_time_to_first_token_seconds_sum 42.034",
            "leanstream_time_to_first_token_seconds_count 3",
        ] {
            assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
        }
        // Every sample line is `name{labels} value` and every family has HELP and TYPE.
        for l in s.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = l.rsplit_once(' ').unwrap();
            let family = name.split('{').next().unwrap();
            // A histogram's samples are its family's name with a suffix.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|x| {
                    family
                        .strip_suffix(x)
                        .filter(|f| s.contains(&format!("# TYPE {f} histogram")))
                })
                .unwrap_or(family);
            assert!(s.contains(&format!("# TYPE {family} ")), "{family}");
            assert!(s.contains(&format!("# HELP {family} ")), "{family}");
            value.parse::<f64>().unwrap();
        }
        assert!(s.ends_with('\n'));
    }
}
