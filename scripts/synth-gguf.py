#!/usr/bin/env python3
"""Writes same-shape models with random weights from a shape file (bench-shapes/*.toml), one
GGUF per weight type listed there, for speed runs where a real model would not travel (speed
depends on shapes and types, not values; random values are never all zero).

    python3 scripts/synth-gguf.py bench-shapes/smollm2-135m.toml OUT_DIR [--types q4_0,f16] [--seed 0]

Every matrix (embedding included) gets the file's type; norms are 1.0, biases small. Type
`q4_k_m` mixes types as llama.cpp's Q4_K_M does: Q4_K, with attention's v and the FFN's down in
Q6_K in the layers where llama.cpp gives them more bits, and an output head of Q6_K (written
even for a tied shape, as the real files hold one); K-quants need rows of whole 256s. The
vocabulary is a SentencePiece-style one (specials, 256 byte tokens, fillers) so text encodes
through byte fallback. Needs numpy and the `gguf` package.
"""
import argparse
import os
import tomllib

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
TYPES = {"f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q4_k": T.Q4_K,
         "q6_k": T.Q6_K}


def more_bits(i, n):
    """llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def f16_bits(rng, n, scale):
    return (rng.standard_normal(n, dtype=np.float32) * scale).astype(np.float16).view(np.uint8)


def matrix(rng, rows, cols, ty):
    """Bytes of a rows x cols matrix in `ty`, as (rows, row_bytes) uint8 (or f16 values)."""
    if ty == "f16":
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
    nb = cols // 32
    blocks = rows * nb
    if ty == "q8_0":
        d = np.full(blocks, 0.02 / 64, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
        qs = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8)
        # As llama.cpp's quantize writes them (d = amax / 127): each block holds a +-127. Without
        # it a block's largest |q| is often even, 2k, and an embedding row's value k then
        # requantizes to an exact tie (k * 127 / 2k = 63.5): its int8 activation turns on the
        # last bit of the RMSNorm, so a GPU's and the CPU's sum orders pick different bytes in
        # layer 0 (docs/HIL.md round 43).
        qs[np.arange(blocks), rng.integers(0, 32, size=blocks)] = rng.choice(
            np.array([-127, 127], dtype=np.int8), size=blocks)
        out = np.concatenate([d, qs.view(np.uint8)], axis=1)
    elif ty == "q4_0":
        d = np.full(blocks, 0.02 / 4, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
        qs = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
        out = np.concatenate([d, qs], axis=1)
    elif ty == "q4_1":
        d = np.full(blocks, 0.02 / 4, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
        m = np.full(blocks, -0.02 * 2, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
        qs = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
        out = np.concatenate([d, m, qs], axis=1)
    elif ty in ("q4_k", "q6_k"):
        if cols % 256:
            raise SystemExit(f"{ty} needs rows of whole 256s, not {cols}")
        sbs = rows * cols // 256
        if ty == "q4_k":
            # d, dmin (centring q * sc against m on average), 12 bytes of 6-bit scales and mins.
            d = np.full(sbs, 1.3e-4, dtype=np.float16).view(np.uint8).reshape(sbs, 2)
            dmin = np.full(sbs, 7.5 * 1.3e-4, dtype=np.float16).view(np.uint8).reshape(sbs, 2)
            rest = rng.integers(0, 256, size=(sbs, 140), dtype=np.uint8)
            out = np.concatenate([d, dmin, rest], axis=1)
        else:
            # 128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, then d.
            rest = rng.integers(0, 256, size=(sbs, 208), dtype=np.uint8)
            d = np.full(sbs, 2.5e-5, dtype=np.float16).view(np.uint8).reshape(sbs, 2)
            out = np.concatenate([rest, d], axis=1)
    else:
        raise SystemExit(f"unknown type {ty}")
    return out.reshape(rows, -1)


def write(shape, ty, path, seed):
    rng = np.random.default_rng(seed)
    arch = shape["arch"]
    w = gguf.GGUFWriter(path, arch)
    L, dim, hid = shape["layers"], shape["dim"], shape["hidden"]
    heads, kvh, vocab = shape["heads"], shape["kv_heads"], shape["vocab"]
    hd = dim // heads
    w.add_block_count(L)
    w.add_context_length(shape["context"])
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hid)
    w.add_head_count(heads)
    w.add_head_count_kv(kvh)
    w.add_rope_freq_base(shape["rope_base"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [f"t{i}" for i in range(vocab - len(toks))]
    w.add_token_list(toks)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    mixed = ty == "q4_k_m"

    def add(name, rows, cols, t):
        t = t if mixed else ty
        w.add_tensor(name, matrix(rng, rows, cols, t), raw_dtype=TYPES[t])

    add("token_embd.weight", vocab, dim, "q4_k")
    if mixed or not shape.get("tied_output", True):
        add("output.weight", vocab, dim, "q6_k")
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
        for n, r, c in [("attn_q", dim, dim), ("attn_k", kvh * hd, dim), ("attn_v", kvh * hd, dim),
                        ("attn_output", dim, dim), ("ffn_gate", hid, dim), ("ffn_up", hid, dim),
                        ("ffn_down", dim, hid)]:
            big = n in ("attn_v", "ffn_down") and more_bits(i, L)
            add(p + n + ".weight", r, c, "q6_k" if big else "q4_k")
        if arch == "qwen2":
            for n, r in [("attn_q", dim), ("attn_k", kvh * hd), ("attn_v", kvh * hd)]:
                w.add_tensor(p + n + ".bias", (rng.standard_normal(r) * 0.02).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("out_dir")
    ap.add_argument("--types", default="")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shape = tomllib.load(open(a.shape, "rb"))
    name = os.path.basename(a.shape)[: -len(".toml")]
    os.makedirs(a.out_dir, exist_ok=True)
    for ty in (a.types.split(",") if a.types else shape["types"]):
        path = os.path.join(a.out_dir, f"{name}-{ty}.gguf")
        write(shape, ty, path, a.seed)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
