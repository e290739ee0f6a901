#!/usr/bin/env python3
"""Write a seed corpus for the gguf fuzz target into fuzz/corpus/gguf (not committed):
tiny valid GGUF files made with gguf-py's writer (llama and qwen2 shapes, every tensor
type the engine reads), plus the first 4 KB of a real vocab GGUF when ../shared is present."""
import os
import sys

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as T, quants

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "corpus", "gguf")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1)


def tiny(path, arch, qtype, bias, tied, d=32, f=32, v=4):
    w = GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_embedding_length(d)
    w.add_feed_forward_length(f)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(64)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_token_list(["a", "b", "<s>", "</s>"])
    w.add_token_scores([0.0, -1.0, 0.0, 0.0])
    w.add_token_types([1, 1, 3, 3])

    def t(name, shape, q=qtype):
        x = (rng.standard_normal(shape[::-1]) * 0.1).astype(np.float32)
        if q in (T.F32,):
            w.add_tensor(name, x)
        elif q == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        elif q in (T.Q4_K, T.Q6_K):  # gguf-py cannot quantize these: random blocks, sane scales
            bs, bb = quants.GGML_QUANT_SIZES[q]
            raw = rng.integers(0, 256, size=(x.size // bs, bb), dtype=np.uint8)
            for col in ((0, 2) if q == T.Q4_K else (208,)):
                raw[:, col:col + 2] = np.array([0x1400], dtype=np.uint16).view(np.uint8)
            w.add_tensor(name, raw.reshape(x.shape[:-1] + (-1,)), raw_dtype=q)
        else:
            w.add_tensor(name, quants.quantize(x, q), raw_dtype=q)

    kv = d // 2
    t("token_embd.weight", (d, v))
    t("output_norm.weight", (d,), T.F32)
    if not tied:
        t("output.weight", (d, v))
    t("blk.0.attn_norm.weight", (d,), T.F32)
    for n, s in (("attn_q", (d, d)), ("attn_k", (d, kv)), ("attn_v", (d, kv)), ("attn_output", (d, d))):
        t(f"blk.0.{n}.weight", s)
    if bias:
        for n, s in (("attn_q", d), ("attn_k", kv), ("attn_v", kv)):
            t(f"blk.0.{n}.bias", (s,), T.F32)
    t("blk.0.ffn_norm.weight", (d,), T.F32)
    t("blk.0.ffn_gate.weight", (d, f))
    t("blk.0.ffn_up.weight", (d, f))
    t("blk.0.ffn_down.weight", (f, d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


for i, q in enumerate((T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)):
    tiny(os.path.join(out, f"llama-{q.name}.gguf"), "llama", q, False, i % 2 == 0)
tiny(os.path.join(out, "qwen2-Q8_0.gguf"), "qwen2", T.Q8_0, True, False)
tiny(os.path.join(out, "llama-Q4_K.gguf"), "llama", T.Q4_K, False, True, d=256, f=256)
tiny(os.path.join(out, "llama-Q6_K.gguf"), "llama", T.Q6_K, False, False, d=256, f=256)
# Minimal files (under 4 KB, the fuzzing max_len): hyper keys and one tensor of each type.
for q in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K):
    path = os.path.join(out, f"mini-{q.name}.gguf")
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_context_length(8)
    w.add_layer_norm_rms_eps(1e-5)
    n = 256 if q in (T.Q4_K, T.Q6_K) else 32
    bs, bb = quants.GGML_QUANT_SIZES[q]
    raw = rng.integers(0, 256, size=(2, n // bs * bb), dtype=np.uint8)
    w.add_tensor("token_embd.weight", raw, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
vocab = os.path.join(here, "..", "..", "shared", "data", "tokenizer-fixtures", "ggml-vocab-gpt-2.gguf")
if os.path.exists(vocab):
    with open(vocab, "rb") as src, open(os.path.join(out, "vocab-prefix.gguf"), "wb") as dst:
        dst.write(src.read(4096))
for name in sorted(os.listdir(out)):
    print(name, os.path.getsize(os.path.join(out, name)), file=sys.stderr)
