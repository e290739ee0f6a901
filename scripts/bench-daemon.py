#!/usr/bin/env python3
"""Serving figures for docs/BENCHMARKS.md, in one run against a real leanstreamd:
time to first token and decode tok/s with 1 and with 8 concurrent streaming clients, and the
daemon's RSS (current and peak) after 10 and after 1000 requests.

usage: scripts/bench-daemon.py --model M [--rss-model M2 --rss-tokenizer T] [--out docs/bench-daemon.json]
Builds nothing: run `cargo build --release` first. Uses only the standard library."""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMON = os.path.join(ROOT, "target/release/leanstreamd")


def start(model, tokenizer=None):
    sock = os.path.join(tempfile.mkdtemp(), "bench.sock")
    cmd = [DAEMON, "--model", model, "--socket", sock]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while True:
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); break
        except OSError:
            if time.time() - t0 > 120 or p.poll() is not None:
                sys.exit("leanstreamd did not start")
            time.sleep(0.05)
    time.sleep(0.3)
    return p, sock


def post(sock, path, body):
    data = json.dumps(body).encode()
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    t0 = time.perf_counter()
    s.sendall(b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    first, events, buf = None, 0, b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        if first is None and b'"text":"' in buf.split(b"\r\n\r\n", 1)[-1] and b"data: {" in buf:
            first = time.perf_counter()
    end = time.perf_counter()
    s.close()
    status = int(buf.split(b" ", 2)[1])
    body = buf.split(b"\r\n\r\n", 1)[1]
    events = body.count(b"data: {") - 1  # the last event carries finish_reason and usage
    return status, t0, first, end, events


def stream_run(sock, clients, requests_each, max_tokens, prompt):
    results, lock = [], threading.Lock()

    def client(i):
        for r in range(requests_each):
            st, t0, first, end, n = post(sock, "/v1/completions", {
                "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True})
            with lock:
                results.append((st, first - t0 if first else None, n / (end - first) if first and end > first else 0.0))
    ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    [t.start() for t in ts]; [t.join() for t in ts]
    wall = time.perf_counter() - t0
    ok = [r for r in results if r[0] == 200]
    total_tokens = sum(max_tokens for _ in ok)
    return {
        "clients": clients, "requests": len(results), "ok": len(ok),
        "ttft_ms_median": round(1000 * statistics.median(r[1] for r in ok), 1),
        "ttft_ms_max": round(1000 * max(r[1] for r in ok), 1),
        "per_client_tok_s_median": round(statistics.median(r[2] for r in ok), 1),
        "aggregate_tok_s": round(total_tokens / wall, 1),
    }


def rss(pid):
    vals = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            vals[k] = int(v.split()[0])
    return vals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rss-model", help="a small model for the 1000-request RSS run (default: --model)")
    ap.add_argument("--rss-tokenizer")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-daemon.json"))
    ap.add_argument("--rss-only", action="store_true", help="skip the speed runs")
    a = ap.parse_args()
    prompt = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea,"
    out = {"model": os.path.basename(a.model), "max_tokens": a.max_tokens}
    if not a.rss_only:
        p, sock = start(a.model)
        try:
            out["one_client"] = stream_run(sock, 1, 4, a.max_tokens, prompt)
            out["eight_clients"] = stream_run(sock, 8, 2, a.max_tokens, prompt)
        finally:
            p.terminate(); p.wait()
    p, sock = start(a.rss_model or a.model, a.rss_tokenizer)
    try:
        n = 0
        def burst(k):
            nonlocal n
            for i in range(k):
                st = post(sock, "/v1/completions", {"prompt": f"Once upon a time {i}", "max_tokens": 16,
                                                    "temperature": 0.8, "seed": i, "stream": i % 2 == 0})[0]
                assert st == 200, st
                n += 1
        burst(10)
        out["rss_after_10"] = rss(p.pid)
        burst(290)
        out["rss_after_300"] = rss(p.pid)
        burst(700)
        out["rss_after_1000"] = rss(p.pid)
        out["rss_model"] = os.path.basename(a.rss_model or a.model)
    finally:
        p.terminate(); p.wait()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    if not a.rss_only:
        print("| clients | requests | TTFT median (ms) | TTFT max (ms) | per-client tok/s | aggregate tok/s |")
        print("|---|---|---|---|---|---|")
        for o in (out["one_client"], out["eight_clients"]):
            print(f"| {o['clients']} | {o['ok']}/{o['requests']} | {o['ttft_ms_median']} | {o['ttft_ms_max']} | "
                  f"{o['per_client_tok_s_median']} | {o['aggregate_tok_s']} |")
    print(f"\nRSS of leanstreamd on {out['rss_model']}, KiB (VmRSS / peak VmHWM):")
    for n in (10, 300, 1000):
        r = out[f"rss_after_{n}"]
        print(f"  after {n:4} requests: {r['VmRSS']} / {r['VmHWM']}")


if __name__ == "__main__":
    main()
