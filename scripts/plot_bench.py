#!/usr/bin/env python3
"""Plot decode step time vs context length (fp16 vs KIVI-2 vs KIVI-4) from kivi-bench --json.

    python3 scripts/plot_bench.py bench.json plot.png [--anchor=S:US ...] [--title=TEXT]

Reads the "sweep" records (kivi-bench --sweep); optional --anchor=S:US adds fp16 cuDNN anchor
points (e.g. --anchor=4096:31 --anchor=32768:139) and --title=TEXT sets the title."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    anchors = [a.split("=", 1)[1] if "=" in a else None for a in argv[1:] if a.startswith("--anchor")]
    titles = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--title=")]
    if len(args) != 2:
        print(__doc__)
        return 2
    data = json.load(open(args[0]))
    rows = data.get("sweep", [])
    if not rows:
        print("no 'sweep' records: run kivi-bench --sweep --json FILE")
        return 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for bits, label, style in ((16, "fp16 (ours)", "o-"), (4, "KIVI-4", "s-"), (2, "KIVI-2", "^-")):
        pts = sorted((r["seq_len"], r["time_us"]) for r in rows if r["bits"] == bits)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    pts = []
    for a in anchors:
        if a:
            s, us = a.split(":")
            pts.append((int(s), float(us)))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "kx--", label="fp16 cuDNN (anchors-gpu.md)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens), B = 1, 32 heads, D = 128")
    ax.set_ylabel("decode step, µs (median wall, synchronous call)")
    ax.set_title(titles[0] if titles else "libkivi-omp decode step on %s" % data.get("device", "?"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args[1], dpi=110)
    print("wrote", args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
