#!/usr/bin/env python3
"""The summary tables of docs/STREAMING.md from `leanstream stream-bench` JSON files.

usage: scripts/stream-tables.py docs/streaming/stream-<model>.json ...  (Markdown on stdout)

Per model: the miss ratio by policy at 25% and 50% budgets beside Belady's floor (the shape of
the LeanStream paper's Table 4), then per sparsity and placement a row per budget with each
policy's decode tok/s, miss ratio, MiB read per token and I/O-wait share.
"""
import json
import sys

POLICIES = ("lru", "lfu", "hot")


def main(paths):
    for path in paths:
        d = json.load(open(path))
        runs = d["runs"]
        key = lambda r: (r["sparsity"], r["placement"], r["budget_percent"])
        cell = {}
        for r in runs:
            cell.setdefault(key(r), {})[r["policy"]] = r
        sparsities = sorted({r["sparsity"] for r in runs})
        placements = sorted({r["placement"] for r in runs}, key=lambda p: p != "identity")
        budgets = sorted({r["budget_percent"] for r in runs})
        print(f"### {d['model']}\n")
        print(
            f"{d['threads']} threads, {d['tokens']} measured tokens after {d['warm_tokens']} warm-up tokens; "
            f"reads {'with O_DIRECT' if d['o_direct'] else 'through the page cache'}. "
            f"Dense in memory {d['dense_tok_per_s']:.2f} tok/s; sparse in memory "
            + ", ".join(f"{t:.2f} (sparsity {s})" for s, t in zip(sparsities, d["oracle_tok_per_s"]))
            + " tok/s.\n"
        )
        print("| sparsity | placement | budget | lru | lfu | hot | Belady (floor) |")
        print("|---|---|---|---|---|---|---|")
        for s in sparsities:
            for p in placements:
                for b in (25, 50):
                    row = cell.get((s, p, b))
                    if not row:
                        continue
                    m = [f"{row[k]['miss_ratio']:.3f}" if k in row else "-" for k in POLICIES]
                    floor = next(iter(row.values()))["belady_miss_ratio"]
                    print(f"| {s} | {p} | {b:g}% | {' | '.join(m)} | {floor:.3f} |")
        print()
        for s in sparsities:
            for p in placements:
                print(
                    f"Sparsity {s}, {p} placement: decode tok/s / miss ratio / MiB read per token / "
                    "I/O-wait share, and Belady's miss ratio on the same requests:\n"
                )
                print("| budget | " + " | ".join(POLICIES) + " | Belady |")
                print("|---|---|---|---|---|")
                for b in budgets:
                    row = cell.get((s, p, b))
                    if not row:
                        continue
                    def fmt(k):
                        if k not in row:
                            return "-"
                        r = row[k]
                        return (
                            f"{r['decode_tok_per_s']:.2f} / {r['miss_ratio']:.3f} / "
                            f"{r['bytes_per_token'] / 1048576:.1f} / {r['io_wait_share'] * 100:.0f}%"
                        )
                    floor = next(iter(row.values()))["belady_miss_ratio"]
                    print(f"| {b:g}% | " + " | ".join(fmt(k) for k in POLICIES) + f" | {floor:.3f} |")
                print()


if __name__ == "__main__":
    main(sys.argv[1:])
