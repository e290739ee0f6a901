#!/usr/bin/env python3
"""Generate tests/fixtures/dequant.txt: dequantization results from an independent
implementation (the numpy dequantizers of PyPI `gguf`, `pip install gguf numpy`), checked
bit-exactly by tests/dequant_fixtures.rs against firmware/model/ggml.rs.

Line kinds (whitespace-separated tokens, all numbers hex unless noted):
  real MODEL TENSOR TYPE ROW(dec) NCOLS(dec) HASH SUM64 V0 .. V31
      A row of a tensor of a real model: HASH = sum over i of (i+1)*bits(v_i) mod 2^64 over
      the whole row, SUM64 = f64 bits of the sequential (left to right) f64 sum of the row,
      V* = f32 bit patterns of the first 32 values.
  synth TYPE N SRC V0 .. V(N-1)
      Raw blocks SRC (hex bytes) built from a seeded RNG, and the f32 bits of all N values.
  q8 N X0 .. X(N-1) DST
      quantize_row_q8_0 input f32 bits and the expected Q8_0 bytes (gguf.quants.Q8_0 is
      bit-exact with ggml's quantize_row_q8_0_ref).
  f16 F32BITS F16BITS
      f32 -> f16 round-to-nearest-even (numpy astype(float16)).

Usage: scripts/gen-dequant-fixtures.py [MODEL_DIR] > tests/fixtures/dequant.txt
MODEL_DIR defaults to $LEANSTREAM_MODELS or ~/.cache/leanstream/models.
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf import quants

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct.gguf"]
NAMES = {T.F32: "F32", T.F16: "F16", T.BF16: "BF16", T.Q4_0: "Q4_0", T.Q4_1: "Q4_1",
         T.Q5_0: "Q5_0", T.Q5_1: "Q5_1", T.Q8_0: "Q8_0", T.Q4_K: "Q4_K", T.Q6_K: "Q6_K"}


def bits(v):
    return np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)


def row_hash(v):
    b = bits(v).astype(np.uint64)
    i = np.arange(1, len(b) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(np.sum(b * i, dtype=np.uint64))


def seq_sum(v):
    return float(np.cumsum(v.astype(np.float64))[-1])


def f64bits(x):
    return int(np.array([x], dtype=np.float64).view(np.uint64)[0])


def dequant(raw, ty):
    if ty == T.F32:
        return raw.view(np.float32).reshape(-1)
    return quants.dequantize(raw, ty).reshape(-1).astype(np.float32)


def real_lines(model_dir):
    out = []
    for m in MODELS:
        path = os.path.join(model_dir, m)
        if not os.path.exists(path):
            sys.exit(f"{path} not found (run scripts/fetch-model.sh)")
        r = GGUFReader(path)
        by_type = {}
        for t in r.tensors:
            by_type.setdefault(t.tensor_type, []).append(t)
        for ty, ts in sorted(by_type.items()):
            # Up to two tensors per type: the first, and one from the middle of the file.
            picks = [ts[0]] + ([ts[len(ts) // 2]] if len(ts) > 1 else [])
            for t in picks:
                ncols = int(t.shape[0])
                nrows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
                raw = np.asarray(t.data).reshape(nrows, -1)
                for row in sorted({0, nrows // 2, nrows - 1}):
                    v = dequant(np.ascontiguousarray(raw[row]).reshape(1, -1), ty)
                    assert len(v) == ncols, (t.name, len(v), ncols)
                    first = " ".join(f"{b:08x}" for b in bits(v[:32]))
                    out.append(f"real {m} {t.name} {NAMES[ty]} {row} {ncols} "
                               f"{row_hash(v):016x} {f64bits(seq_sum(v)):016x} {first}")
    return out


def synth_blocks(rng, ty, n_blocks):
    """Random raw blocks whose f16 scale fields hold sane finite values."""
    size = quants.GGML_QUANT_SIZES[ty][1]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def put_f16(col, lo, hi, signed=False):
        x = rng.uniform(lo, hi, size=n_blocks)
        if signed:
            x *= rng.choice([-1.0, 1.0], size=n_blocks)
        b[:, col:col + 2] = x.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)

    if ty in (T.Q4_0, T.Q5_0, T.Q8_0):
        put_f16(0, 1e-4, 0.1, signed=True)
    elif ty in (T.Q4_1, T.Q5_1):
        put_f16(0, 1e-4, 0.1)
        put_f16(2, 1e-3, 1.0, signed=True)
    elif ty == T.Q4_K:
        put_f16(0, 1e-4, 0.01)
        put_f16(2, 1e-4, 0.01)
    elif ty == T.Q6_K:
        put_f16(208, 1e-4, 0.01, signed=True)
    return b


def synth_lines(rng):
    out = []
    # F16: random finite halves, including subnormals and zeros of both signs.
    h = rng.integers(0, 1 << 16, size=256, dtype=np.uint16)
    h = h[(h & 0x7C00) != 0x7C00][:240]
    h = np.concatenate([h, np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF,
                                     0x7C00, 0xFC00, 0x3C00, 0x3555, 0x0200, 0x83FF, 0x5140, 0xC000],
                                    dtype=np.uint16)])
    raw = h.view(np.uint8)
    v = raw.view(np.float16).astype(np.float32)
    out.append(("F16", raw, v))
    # BF16: random bf16 patterns that are not NaN.
    h = rng.integers(0, 1 << 16, size=300, dtype=np.uint16)
    h = h[((h & 0x7F80) != 0x7F80) | ((h & 0x7F) == 0)][:256]
    raw = h.view(np.uint8)
    out.append(("BF16", raw, dequant(raw.reshape(-1, 2), T.BF16)))
    # F32 passthrough.
    x = rng.standard_normal(64).astype(np.float32)
    out.append(("F32", x.view(np.uint8), x))
    # Every quantized type from random raw blocks (2 K-quant or 8 classic blocks).
    for ty in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K):
        nb = 2 if ty in (T.Q4_K, T.Q6_K) else 8
        raw = synth_blocks(rng, ty, nb)
        out.append((NAMES[ty], raw.reshape(-1), dequant(raw, ty)))
    # And from gguf.quants' own quantizers, on seeded normal data (the types the models lack).
    for ty in (T.Q4_0, T.Q5_1, T.BF16):
        x = (rng.standard_normal((4, 64)) * 0.05).astype(np.float32)
        raw = quants.quantize(x, ty)
        out.append((NAMES[ty], raw.reshape(-1).view(np.uint8), dequant(raw, ty)))
    lines = []
    for name, raw, v in out:
        vals = " ".join(f"{b:08x}" for b in bits(v))
        lines.append(f"synth {name} {len(v)} {bytes(raw.tobytes()).hex()} {vals}")
    return lines


def q8_lines(rng):
    lines = []
    for scale in (1.0, 1e-3, 300.0):
        x = (rng.standard_normal(64) * scale).astype(np.float32)
        x[5] = 0.0
        q = quants.quantize(x.reshape(1, -1), T.Q8_0).reshape(-1)
        lines.append(f"q8 64 {' '.join(f'{b:08x}' for b in bits(x))} {q.tobytes().hex()}")
    x = np.zeros(32, dtype=np.float32)
    q = quants.quantize(x.reshape(1, -1), T.Q8_0).reshape(-1)
    lines.append(f"q8 32 {' '.join(f'{b:08x}' for b in bits(x))} {q.tobytes().hex()}")
    return lines


def f16_lines(rng):
    xs = list(rng.standard_normal(200).astype(np.float32) * np.float32(100))
    xs += list((rng.standard_normal(100) * 1e-6).astype(np.float32))  # subnormal halves
    # Exact ties: halfway between adjacent halves, both parities; overflow and underflow edges.
    for h in (0x3C00, 0x3C01, 0x0001, 0x0002, 0x7BFE, 0x03FF):
        a = np.array([h, h + 1], dtype=np.uint16).view(np.float16).astype(np.float32)
        xs.append(np.float32((np.float64(a[0]) + np.float64(a[1])) / 2))
    xs += [np.float32(v) for v in (65504.0, 65519.996, 65520.0, 1e10, -1e10, 2.0**-25, 2.0**-26,
                                   3 * 2.0**-26, 0.0, -0.0, 1.0, -1.0)]
    xs = np.array(xs, dtype=np.float32)
    with np.errstate(over="ignore"):
        hs = xs.astype(np.float16).view(np.uint16)
    return [f"f16 {b:08x} {h:04x}" for b, h in zip(bits(xs), hs)]


def main():
    model_dir = (sys.argv[1] if len(sys.argv) > 1 else
                 os.environ.get("LEANSTREAM_MODELS", os.path.expanduser("~/.cache/leanstream/models")))
    rng = np.random.default_rng(20240607)
    print("# generated by scripts/gen-dequant-fixtures.py (gguf-py numpy dequantizers); do not edit")
    for line in synth_lines(rng) + q8_lines(rng) + f16_lines(rng) + real_lines(model_dir):
        print(line)


if __name__ == "__main__":
    main()
