#!/usr/bin/env python3
"""Speculate-and-refine figures (the paper's figure 12) from the reports `leanstream
predictor-report --refine` wrote (docs/predictors/refine-<model>.json): per report a PNG with
(a) top-10% recall and importance ratio after each stage, mean over layers, priority order
against index order, and (b) the importance ratio per stage for five layers; and a Markdown
table of the means on standard output.

  python3 scripts/refine-plot.py docs/predictors
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "docs/predictors"
print("| model | predictor reads | order | metric | " + " | ".join(f"{k}/8" for k in range(9)) + " |")
print("|---|---|---|---|" + "---|" * 9)
for path in sorted(glob.glob(os.path.join(out, "refine-*.json"))):
    r = json.load(open(path))
    k = r["stages"]
    name = os.path.basename(path)[len("refine-"):-len(".json")]
    fig, axs = plt.subplots(1, 2, figsize=(11, 3.8))
    for order, style in [("priority", "-"), ("index", "--")]:
        for metric, label in [("top10_recall", "top-10% recall"), ("importance", "importance ratio")]:
            mean = r["orders"][order][metric]["mean"]
            print(
                f"| {r['model']} | {r['settings'].get('input', '')} | {order} | {label} | "
                + " | ".join(f"{v:.3f}" for v in mean)
                + " |"
            )
            axs[0].plot(range(k + 1), mean, style, marker="o", label=f"{label}, {order} order")
    layers = r["orders"]["priority"]["importance"]["layers"]
    picks = sorted({round(i * (len(layers) - 1) / 4) for i in range(5)})
    for i in picks:
        # layers[i] predicts layer i + 1 from layer i's stages.
        axs[1].plot(range(k + 1), layers[i], marker=".", label=f"layer {i + 1} from {i}")
    axs[0].set_title("mean over layers")
    axs[1].set_title("importance ratio per layer (priority order)")
    for ax in axs:
        ax.set_xlabel(f"stages of layer n done (of {k}); 0 = one-shot guess")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{r['model']}: layer n+1 guessed during layer n by the hashing table "
        f"(sparsity {r['sparsity']}, {r['tokens']} held-out tokens)"
    )
    fig.tight_layout()
    png = os.path.join(out, f"refine-{name}.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"\n![refinement, {r['model']}](predictors/refine-{name}.png)\n", file=sys.stderr)
