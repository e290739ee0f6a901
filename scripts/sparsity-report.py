#!/usr/bin/env python3
"""Turns the JSON written by scripts/sparsity-report.sh into docs/SPARSITY.md and its plots.

usage: scripts/sparsity-report.py DATA_DIR OUT.md   (DATA_DIR: ppl-*.json, stats-*.json, calibrate-*.txt)
"""
import glob
import json
import os
import statistics as st
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODELS = [
    ("smollm2-135m", "SmolLM2-135M-Instruct (Q4_1)"),
    ("qwen2.5-0.5b", "Qwen2.5-Coder-0.5B-Instruct (GGUF: Q5_0/Q8_0 rows, K-quant down)"),
]
LEVELS = [0.0, 0.3, 0.5, 0.7, 0.8, 0.9]


def load_ppl(data, key):
    res = {}
    for path in sorted(glob.glob(os.path.join(data, f"ppl-{key}*.json"))):
        for r in json.load(open(path))["results"]:
            k = (r["mode"], r["score"], round(r["sparsity"], 2))
            old = res.get(k)
            if old is None or r["windows"] > old["windows"]:
                res[k] = r
    return res


def mean(v):
    return st.mean(v) if v else float("nan")


def ppl_section(data, key, name, out_dir, lines, figs):
    res = load_ppl(data, key)
    if not res:
        lines.append(f"### {name}\n\nNot measured (no `ppl-{key}*.json`).\n")
        return
    dense = res.get(("dense", "-", 0.0))
    lines.append(f"### {name}\n")
    windows = sorted({r["windows"] for r in res.values()})
    lines.append(
        f"WikiText-2 test, windows of 512 tokens from the start, no BOS; windows used: "
        f"{', '.join(str(w) for w in windows)} (a row's count is in its last column). "
        "Oracle mode, thresholds calibrated on other text of the same file (see Method).\n"
    )
    lines.append("| sparsity | glu: ppl | glu: vs dense | glu: dropped | gate: ppl | gate: vs dense | gate: dropped | windows |")
    lines.append("|---|---|---|---|---|---|---|---|")
    if dense:
        lines.append(f"| dense | {dense['ppl']:.4f} | - | 0 | {dense['ppl']:.4f} | - | 0 | {dense['windows']} |")
    fig, ax = plt.subplots(figsize=(6, 4))
    for score in ["glu", "gate"]:
        xs, ys = [], []
        for s in LEVELS:
            r = res.get(("oracle", score, s))
            if r and dense and r["windows"] == dense["windows"]:
                xs.append(s)
                ys.append(100 * (r["ppl"] / dense["ppl"] - 1))
        if xs:
            ax.plot(xs, ys, marker="o", label=f"oracle, |SiLU(gate){' * up' if score == 'glu' else ''}|")
    for s in LEVELS:
        cells = []
        wins = set()
        for score in ["glu", "gate"]:
            r = res.get(("oracle", score, s))
            if r is None:
                cells += ["not run", "", ""]
                continue
            wins.add(r["windows"])
            rel = ""
            if dense and dense["windows"] == r["windows"]:
                rel = f"{100 * (r['ppl'] / dense['ppl'] - 1):+.1f}%"
            elif dense:
                d = mean(dense["per_window"][: r["windows"]])
                rel = f"(window-mean vs dense {100 * (mean(r['per_window']) / d - 1):+.1f}%)"
            cells += [f"{r['ppl']:.4f}", rel, f"{r['dropped']:.3f}"]
        lines.append(f"| {s:.1f} | " + " | ".join(cells) + f" | {', '.join(str(w) for w in sorted(wins))} |")
    lines.append("")
    ax.axhline(3, color="gray", ls="--", lw=0.8, label="+3% (goal at 50%)")
    ax.set_xlabel("sparsity S (fraction of FFN neurons dropped)")
    ax.set_ylabel("perplexity vs dense (%)")
    ax.set_title(name)
    ax.legend()
    ax.grid(alpha=0.3)
    f = f"sparsity-ppl-{key}.png"
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f), dpi=110)
    plt.close(fig)
    figs.append(f)
    lines.append(f"![perplexity against sparsity, {name}]({os.path.basename(out_dir)}/{f})\n")
    # The ablation: dropped neurons counted as zero (`--dropped-mean off`), if measured.
    zero_path = os.path.join(data, f"dropped-zero-ppl-{key}.json")
    if os.path.exists(zero_path) and dense:
        zero = {}
        for r in json.load(open(zero_path))["results"]:
            zero[(r["mode"], r["score"], round(r["sparsity"], 2))] = r
        lines.append(
            f"Dropped neurons counted as zero instead of their mean (`--dropped-mean off`; "
            f"`{os.path.basename(zero_path)}`), against the same dense run:\n"
        )
        lines.append("| sparsity | glu: mean / zero | gate: mean / zero |")
        lines.append("|---|---|---|")
        for s in LEVELS:
            cells = []
            for score in ["glu", "gate"]:
                r, z = res.get(("oracle", score, s)), zero.get(("oracle", score, s))
                ok = r and z and r["windows"] == z["windows"] == dense["windows"]
                cells.append(
                    f"{100 * (r['ppl'] / dense['ppl'] - 1):+.1f}% / {100 * (z['ppl'] / dense['ppl'] - 1):+.1f}%"
                    if ok else "not run"
                )
            lines.append(f"| {s:.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    # Goals.
    for score in ["glu", "gate"]:
        r5, r8 = res.get(("oracle", score, 0.5)), res.get(("oracle", score, 0.8))
        if dense and r5 and r5["windows"] == dense["windows"]:
            d5 = 100 * (r5["ppl"] / dense["ppl"] - 1)
            verdict = "meets" if d5 <= 3 else "misses"
            msg = f"- {score}: 50% sparsity is {d5:+.1f}% ({verdict} the +3% goal)"
            if r8 and r8["windows"] == dense["windows"]:
                msg += f"; 80% is {100 * (r8['ppl'] / dense['ppl'] - 1):+.1f}%"
            lines.append(msg + ".")
    lines.append("")


def stats_section(data, key, name, out_dir, lines, figs):
    path = os.path.join(data, f"stats-{key}.json")
    if not os.path.exists(path):
        lines.append(f"### {name}\n\nNo trace statistics (no `stats-{key}.json`).\n")
        return
    d = json.load(open(path))
    L = d["layers"]
    lines.append(f"### {name}\n")
    lines.append(
        f"{d['tokens']} tokens of the test text, {L} layers, {d['hidden']} neurons per layer, K = {d['stages']} "
        f"stages over the oracle set at S = {d['trace_sparsity']}.\n"
    )
    sh = {k: d["share"][k] for k in ["0.1", "0.2", "0.5"]}
    lines.append("| | top 10% of neurons | top 20% | top 50% |")
    lines.append("|---|---|---|---|")
    lines.append("| share of the FFN output magnitude, mean over layers | " + " | ".join(f"{mean(sh[k]):.3f}" for k in sh) + " |")
    lines.append("| lowest layer | " + " | ".join(f"{min(sh[k]):.3f} (layer {sh[k].index(min(sh[k]))})" for k in sh) + " |")
    lines.append("| highest layer | " + " | ".join(f"{max(sh[k]):.3f} (layer {sh[k].index(max(sh[k]))})" for k in sh) + " |")
    lines.append("")
    lines.append("| oracle set at S | neurons active on this text | kept from the previous token (mean over layers) | lowest layer |")
    lines.append("|---|---|---|---|")
    for s, v in d["overlap"].items():
        lines.append(f"| {s} | {mean(d['active'][s]):.3f} | {mean(v):.3f} | {min(v):.3f} (layer {v.index(min(v))}) |")
    lines.append("")
    fig, axs = plt.subplots(1, 2, figsize=(10, 3.6))
    for k in sh:
        axs[0].plot(range(L), sh[k], marker=".", label=f"top {int(float(k) * 100)}%")
    axs[0].set_xlabel("layer")
    axs[0].set_ylabel("share of |h_j| * ||down_j||")
    axs[0].set_title("output magnitude carried by the top neurons")
    axs[0].legend()
    axs[0].grid(alpha=0.3)
    for s, v in d["overlap"].items():
        axs[1].plot(range(L), v, marker=".", label=f"S = {s}")
    axs[1].set_xlabel("layer")
    axs[1].set_ylabel("|A_t ∩ A_t-1| / |A_t|")
    axs[1].set_title("active set kept from one token to the next")
    axs[1].legend()
    axs[1].grid(alpha=0.3)
    fig.suptitle(name)
    fig.tight_layout()
    f = f"sparsity-share-overlap-{key}.png"
    fig.savefig(os.path.join(out_dir, f), dpi=110)
    plt.close(fig)
    figs.append(f)
    lines.append(f"![magnitude share and overlap per layer, {name}]({os.path.basename(out_dir)}/{f})\n")
    K = d["stages"]
    lines.append(
        "Predicting layer n+1's oracle set from layer n (mean over layers; stage 0 = the one-shot guess from "
        "the residual entering layer n's FFN; stage k = that residual plus the first k stages of layer n's FFN):\n"
    )
    lines.append("| S | order | metric | " + " | ".join(f"{k}/{K}" for k in range(K + 1)) + " |")
    lines.append("|---|---|---|" + "---|" * (K + 1))
    fig, axs = plt.subplots(1, 3, figsize=(13, 3.6))
    for s, by_order in d["refine"].items():
        for order in ["priority", "index"]:
            for mi, m in enumerate(["recall", "top10", "importance"]):
                rows = by_order[order][m]
                avg = [mean([r[k] for r in rows]) for k in range(K + 1)]
                lines.append(f"| {s} | {order} | {m} | " + " | ".join(f"{v:.3f}" for v in avg) + " |")
                if m == "top10" and s != list(d["refine"])[0]:
                    continue  # top-10% recall does not depend on S
                axs[mi].plot(range(K + 1), avg, marker="o", ls="-" if order == "priority" else "--",
                             label=f"{order} order" + ("" if m == "top10" else f", S = {s}"))
    for ax, t in zip(axs, ["recall of the oracle set", "top-10% recall", "importance ratio"]):
        ax.set_xlabel(f"stages of layer n done (of {K})")
        ax.set_title(t)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name}: refining layer n+1's guess during layer n (paper figure 12)")
    fig.tight_layout()
    f = f"sparsity-refine-{key}.png"
    fig.savefig(os.path.join(out_dir, f), dpi=110)
    plt.close(fig)
    figs.append(f)
    lines.append("")
    lines.append(f"![refinement, {name}]({os.path.basename(out_dir)}/{f})\n")


def main():
    data, out = sys.argv[1], sys.argv[2]
    out_dir = data
    lines = []
    head = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparsity-report-head.md")).read()
    lines.append(head.rstrip() + "\n")
    for key, name in MODELS:
        c = os.path.join(data, f"calibrate-{key}.txt")
        if os.path.exists(c):
            lines.append(f"Calibration of {name} (`calibrate` output):\n\n```\n{open(c).read().strip()}\n```\n")
    lines.append("## Quality: perplexity against sparsity\n")
    figs = []
    for key, name in MODELS:
        ppl_section(data, key, name, out_dir, lines, figs)
    bench = os.path.join(data, "bench-smollm2-135m.md")
    if os.path.exists(bench):
        lines.append("## Speed (decode, CPU, same run)\n")
        lines.append(
            "`leanstream bench --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt-tokens 16 --gen-tokens 64 --reps 15 "
            "--ffn dense,oracle,topk --score glu,gate --sparsity 0.5,0.8` (each configuration its own engine, repetitions "
            "alternating; medians). See docs/BENCHMARKS.md for how to read it.\n"
        )
        lines.append(open(bench).read().strip() + "\n")
    lines.append("## From the traces\n")
    for key, name in MODELS:
        stats_section(data, key, name, out_dir, lines, figs)
    tail = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparsity-report-tail.md")
    if os.path.exists(tail):
        lines.append(open(tail).read().rstrip() + "\n")
    open(out, "w").write("\n".join(lines))
    print(f"wrote {out} and {len(figs)} plots in {out_dir}")


if __name__ == "__main__":
    main()
