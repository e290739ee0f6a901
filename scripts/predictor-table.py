#!/usr/bin/env python3
"""The Markdown table of docs/PREDICTORS.md from the reports scripts/predictor-figures.sh wrote
(docs/predictors/<model>-s<S>[-o4].json): per report and predictor, size, share of the model
file, latency per layer, recall, top-10% recall, loading redundancy and neurons read, and the recall a random read set of that size has on average (read / neurons)."""
import glob
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "docs/predictors"
rows = [
    "| model | sparsity | predictor | shape | bytes | % of model | us/layer | recall | top-10% recall | redundancy | read / neurons | random set's recall |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    r = json.load(open(path))
    if "predictors" not in r:
        continue
    for p in r["predictors"]:
        o, s = p["overall"], p.get("settings") or {}
        if "heads" in s:
            shape = f"{s['heads']}x{s['tau']} d={s['d']}, out {s['out_heads']}x{s['out_tau']}"
        elif "rank" in s:
            shape = f"{'binary, ' if s.get('binary') else ''}rank {s['rank']}"
        else:
            shape = "-"
        if s.get("input") and s["input"] != "FfnInput":
            shape += f", reads {s['input']}"
        rows.append(
            f"| {r['model']} | {r['sparsity']} | {p['name']} | {shape} | {o['bytes']:,} | "
            f"{o['model_pct']:.3f} | {o['us_per_layer']:.1f} | {o['recall']:.3f} | "
            f"{o['top10_recall']:.3f} | {o['redundancy']:.3f} | {o['read_mean']:.0f} / {r['neurons']} | "
            f"{o['read_mean'] / r['neurons']:.3f} |"
        )
print("\n".join(rows))
