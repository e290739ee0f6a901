#!/usr/bin/env bash
# Hardware-in-the-loop: leanstreamd serving with its FFN streamed from a flash image on the GPU
# (docs/STREAMING.md, "The daemon streaming on the GPU"). Runs on the GPU machine over what
# scripts/hil.sh staged in hil-out/ (the h200-hil builds of `leanstream` and `leanstreamd`, the
# cut SmolLM2). Builds nothing of ours. Steps:
#   1. calibrates the model's thresholds on a tracked text (docs/STREAMING.md) and flashes it at
#      w8a8 for the h200-hil board onto this machine's disk, the table inside the image;
#   2. starts leanstreamd on that image with --ffn oracle and a 95% cache (HIL_DAEMON_BUDGET; the h200-hil board keeps 512 reads in
#      flight beside a whole layer, so a cut model needs most of its FFN), on the CPU and then
#      on the GPU in each memory model, and streams the same greedy request through each over
#      its socket (HTTP, server-sent events);
#   3. checks the GPU's text follows the CPU's (at least half of it the same: the int8 gate's
#      noise may part two nearly tied tokens), and that every daemon's /metrics count FFN bytes
#      read from the image and no heap allocation after boot (the streamed request included).
# Exits non-zero on any mismatch. Results land in $OUT (else hil-out/results): daemon-stream.txt.
# HIL_BOARD (h200-hil) is the board the binaries were built for; HIL_DAEMON_RUNS picks runs
# (cpu,cuda-discrete,cuda-unified); HIL_DAEMON_MODEL the GGUF; HIL_DAEMON_TEXT the calibration
# text (a self-contained copy of hil-out/ has no docs/).
set -euo pipefail
cd "$(dirname "$0")/.."
h=${HIL_DIR:-hil-out}
res=${OUT:-$h/results}; mkdir -p "$res"
for b in leanstream leanstreamd; do
  [ -f "$h/$b.xz" ] && { xz -dc "$h/$b.xz" > "$h/$b" && chmod +x "$h/$b"; }
  [ -f "$h/$b.gz" ] && { gunzip -c "$h/$b.gz" > "$h/$b" && chmod +x "$h/$b"; }
done
model=${HIL_DAEMON_MODEL:-$h/models/smollm2-135m-q4_1-cut4.gguf}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
text=${HIL_DAEMON_TEXT:-docs/STREAMING.md}  # any English text: the thresholds' calibration
[ -f "$text" ] || { echo "no calibration text at $text: set HIL_DAEMON_TEXT" >&2; exit 2; }
"$h/leanstream" calibrate --model "$model" --file "$text" --tokens 1024 --ctx 256 \
  --sparsity 0.5 --out "$tmp/model.thresh" 2>&1 | tail -2
"$h/leanstream" flash "$model" --board "${HIL_BOARD:-h200-hil}" --precision w8a8 --thresholds "$tmp/model.thresh" \
  --out "$tmp/model.flash" 2>&1 | tail -2
python3 - "$h/leanstreamd" "$tmp/model.flash" "$tmp" <<'EOF' 2>&1 | tee "$res/daemon-stream.txt"
import json, os, socket, subprocess, sys, time

daemon, image, tmp = sys.argv[1:4]
PROMPT = "Once upon a time"
MAX_TOKENS = 32


def start(args, name):
    sock = os.path.join(tmp, name + ".sock")
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen([daemon, "--model", image, "--socket", sock, "--ffn", "oracle",
                          "--sparsity", "0.5", "--ffn-budget", os.environ.get("HIL_DAEMON_BUDGET", "95%")] + args,
                         stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    while True:
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); return p, sock
        except OSError:
            if p.poll() is not None or time.time() - t0 > 120:
                log.close()
                sys.exit(f"{name}: leanstreamd did not start:\n" + open(log.name).read())
            time.sleep(0.1)


def request(sock, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall(f"{method} {path} HTTP/1.1\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    head, _, rest = buf.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest.decode(errors="replace")


def complete(sock):
    status, body = request(sock, "POST", "/v1/completions", {
        "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True})
    text, finish = "", None
    for line in body.splitlines():
        if line.startswith("data: {"):
            ev = json.loads(line[6:])
            ch = ev["choices"][0]
            text += ch.get("text", "")
            finish = ch.get("finish_reason") or finish
    return status, text, finish


def metric(metrics, name):
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


runs = [("cpu", ["--backend", "cpu"]),
        ("cuda-discrete", ["--backend", "cuda", "--memory", "discrete"]),
        ("cuda-unified", ["--backend", "cuda", "--memory", "unified"])]
only = os.environ.get("HIL_DAEMON_RUNS")  # e.g. "cpu" to try the script without a GPU
runs = [r for r in runs if not only or r[0] in only.split(",")]
texts, failed = {}, False
for name, args in runs:
    p, sock = start(args, name)
    try:
        t0 = time.time()
        status, text, finish = complete(sock)
        dt = time.time() - t0
        _, metrics = request(sock, "GET", "/metrics")
    finally:
        p.terminate(); p.wait(timeout=30)
    read = metric(metrics, "leanstream_ffn_bytes_read_total")
    per_token = metric(metrics, "leanstream_ffn_bytes_read_per_token")
    allocs = metric(metrics, "leanstream_heap_allocations_after_boot_total")
    print(f"{name}: HTTP {status}, finish {finish}, {dt:.2f} s, ffn bytes read {read}, per token {per_token}, heap allocations after boot {allocs}")
    if allocs != 0:
        print(f"FAIL {name}: the serving path allocated after boot"); failed = True
    print(f"  text: {text!r}")
    texts[name] = text
    if status != 200 or not text or finish is None:
        print(f"FAIL {name}: no complete streamed answer"); failed = True
    if read is None or read <= 0:
        print(f"FAIL {name}: /metrics counts no FFN bytes read"); failed = True
# Both backends quantize activations to int8 and sum in other orders, and a neuron at its
# threshold may fall either way (the parity tests' int8 gate): greedy text may part where two
# tokens nearly tie. The GPU's must follow the CPU's for at least half of it.
cpu = texts.get("cpu", "")
for name in [r[0] for r in runs if r[0] != "cpu"]:
    t = texts.get(name, "")
    same = next((i for i, (a, b) in enumerate(zip(t, cpu)) if a != b), min(len(t), len(cpu)))
    print(f"{name}: the first {same} of the CPU's {len(cpu)} characters agree")
    if same < len(cpu) // 2:
        print(f"FAIL {name}: the text parts from the CPU's too early"); failed = True
gpu_runs = [r[0] for r in runs if r[0] != "cpu"]
print("FAIL" if failed else ("ok: the GPU daemons stream the CPU's text from the image" if gpu_runs
                             else "ok: the daemon streams from the image"))
sys.exit(1 if failed else 0)
EOF
