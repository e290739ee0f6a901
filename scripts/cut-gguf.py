#!/usr/bin/env python3
"""Cuts a GGUF model to its first N layers (and optionally its first V vocabulary entries), so a
parity model fits in one hardware-in-the-loop call. Tensors are copied byte for byte.

    python3 scripts/cut-gguf.py IN.gguf OUT.gguf --layers 8 [--vocab 16384]

Needs the `gguf` package (pip install gguf). The CPU/CUDA parity test feeds token ids, so a cut
vocabulary needs no working tokenizer: merges that no longer fit are dropped.
"""
import argparse
import re

import gguf
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=0)
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(a.dst, arch)
    vocab_arrays = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        val = f.contents()
        if name == f"{arch}.block_count":
            val = a.layers
        if a.vocab and name in vocab_arrays:
            val = val[: a.vocab]
        if a.vocab and name == "tokenizer.ggml.merges":
            keep = set(r.fields["tokenizer.ggml.tokens"].contents()[: a.vocab])
            val = [m for m in val if "".join(m.split(" ", 1)) in keep and all(p in keep for p in m.split(" ", 1))]
        if a.vocab and name.endswith("_token_id") and isinstance(val, int) and val >= a.vocab:
            val = a.vocab - 1
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        if vtype == gguf.GGUFValueType.ARRAY and sub is None:
            continue
        w.add_key_value(name, val, vtype, sub_type=sub)
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) >= a.layers:
            continue
        data = np.asarray(t.data)  # rows first; quantized rows are their bytes
        if a.vocab and t.name in ("token_embd.weight", "output.weight"):
            data = data[: a.vocab]
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
