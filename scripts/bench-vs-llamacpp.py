#!/usr/bin/env python3
"""LeanStream against llama.cpp's CPU build on the same model, threads and prompt, in one run.

llama.cpp comes from llama-cpp-python 0.3.36 on PyPI, built from source on this machine: either
the Python binding (CMAKE_ARGS="-DGGML_NATIVE=ON" python3 -m pip install llama-cpp-python==0.3.36)
or, with --llama-bench, the `llama-bench` binary built from the sdist's vendor/llama.cpp
(cmake -B build -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF && cmake --build build --target llama-bench),
which times pp<prompt>, and tg<gen> after the same prompt (`-d`; ANCHORS.md's tg figures started
from an empty cache: `--depth 0`).
usage: scripts/bench-vs-llamacpp.py --model M [--precision native|f16|w8a8|w4a8] [--packing P]
       [--threads 2] [--prompt-tokens 64] [--gen-tokens 128] [--reps 3] [--llama-bench PATH]
       [--leanstream PATH]
Run `cargo build --release` first. Prints a Markdown table; the ratio is LeanStream / llama.cpp.
For the low-bit comparison give a Q8_0 GGUF with `--precision w8a8` and a Q4_0 GGUF with
`--precision w4a8`: both engines then run the very same weights."""
import argparse, json, os, statistics, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def leanstream(a):
    out = tempfile.mktemp(suffix=".json")
    subprocess.run([a.leanstream, "bench", "--model", a.model,
                    "--threads", str(a.threads), "--prompt-tokens", str(a.prompt_tokens),
                    "--gen-tokens", str(a.gen_tokens), "--reps", str(a.reps), "--json", out,
                    "--markdown", os.devnull, "--precision", a.precision, "--packing", a.packing],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = json.load(open(out))
    r = d["configs"][0] if "configs" in d else d["rows"][0]
    return r["prefill_tok_per_s"], r["decode_tok_per_s"]


def llama_bench(a):
    def run(*args):
        out = subprocess.run([a.llama_bench, "-m", a.model, "-t", str(a.threads), "-r", str(a.reps),
                              "-o", "json", *args], check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]["avg_ts"]
    # The prompt from an empty cache; the decode after it, as `leanstream bench` decodes (its
    # tokens attend to the prompt's): tg at depth <prompt> (`--depth 0`: from an empty cache,
    # as ANCHORS.md's tg figures were taken).
    pp = run("-p", str(a.prompt_tokens), "-n", "0")
    depth = a.prompt_tokens if a.depth is None else a.depth
    tg = run("-p", "0", "-n", str(a.gen_tokens), "-d", str(depth))
    return pp, tg


def llamacpp(a):
    if a.llama_bench:
        return llama_bench(a)
    import numpy as np
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=1024,
                n_batch=512, verbose=False)
    # The same prompt text as `leanstream bench`, cut to the same number of tokens.
    seed = ("The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea, "
            "there lived a curious child who loved to read about the stars. ")
    toks = llm.tokenize((seed * (1 + a.prompt_tokens // 8)).encode(), add_bos=False)[:a.prompt_tokens]
    prefill, decode = [], []
    for _ in range(a.reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        t1 = time.perf_counter()
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        for _ in range(a.gen_tokens):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t2 = time.perf_counter()
        prefill.append(len(toks) / (t1 - t0))
        decode.append(a.gen_tokens / (t2 - t1))
    return statistics.median(prefill), statistics.median(decode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--precision", default="native")
    ap.add_argument("--packing", default="auto")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (else the Python binding)")
    ap.add_argument("--depth", type=int, help="llama-bench's decode starts after this many tokens "
                    "(default: the prompt's, as LeanStream's; 0: an empty cache, ANCHORS.md's way)")
    ap.add_argument("--leanstream", default=os.path.join(ROOT, "target/release/leanstream"),
                    help="the leanstream binary (e.g. an earlier build, for a before/after run)")
    a = ap.parse_args()
    # Alternate the two twice so a busy moment does not land on one side only.
    ls, lc = [], []
    for _ in range(2):
        ls.append(leanstream(a))
        lc.append(llamacpp(a))
    lsp, lsd = max(x[0] for x in ls), max(x[1] for x in ls)
    lcp, lcd = max(x[0] for x in lc), max(x[1] for x in lc)
    name = os.path.basename(a.model)
    print(f"| engine | model | threads | prompt tokens | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|---|")
    print(f"| LeanStream (CPU, {a.precision}) | {name} | {a.threads} | {a.prompt_tokens} | {lsp:.1f} | {lsd:.1f} |")
    print(f"| llama.cpp (CPU) | {name} | {a.threads} | {a.prompt_tokens} | {lcp:.1f} | {lcd:.1f} |")
    print(f"| ratio LeanStream / llama.cpp | | | | {lsp / lcp:.2f} | {lsd / lcd:.2f} |")


if __name__ == "__main__":
    main()
