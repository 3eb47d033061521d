#!/usr/bin/env python3
"""Merges kivi_throughput JSON files (also ones cut short: each run is one line) into one JSON,
a markdown table and a PNG plot (tokens/s against batch, one curve per cache, the largest batch
marked).  Later files replace earlier runs of the same cache and batch.

usage: throughput-table.py OUT_PREFIX FILE.json...   (writes OUT_PREFIX.json, .md and, with
       matplotlib installed, .png)"""
import json
import re
import sys


def read(path, caches, order, meta):
    cur = None
    for line in open(path):
        s = line.strip().rstrip(",")
        if s.startswith('{"cache":'):
            head = json.loads(s.split(', "runs": [')[0] + "}")
            cur = head["cache"]
            if cur not in caches:
                caches[cur] = {k: v for k, v in head.items()}
                caches[cur]["runs"] = {}
                order.append(cur)
            caches[cur]["max_batch"] = head["max_batch"] or caches[cur]["max_batch"]
        elif s.startswith('{"batch":') and cur:
            run = json.loads(re.sub(r"\]\}$", "", s))
            caches[cur]["runs"][run["batch"]] = run
        elif s.startswith('"model":'):
            meta["model"] = json.loads("{" + s + "}")["model"]
        elif s.startswith('"prompt":'):
            meta.update(json.loads("{" + s.rstrip(",") + "}"))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    prefix, files = sys.argv[1], sys.argv[2:]
    caches, order, meta = {}, [], {}
    for f in files:
        read(f, caches, order, meta)
    out = dict(meta, sources=files, caches=[])
    base = caches.get("fp16")
    best_base = max((r["tokens_per_s"] for r in base["runs"].values()), default=0) if base else 0
    lines = ["| cache | largest batch | best tokens/s (batch) | vs fp16 | decode step at that batch: matmul / attention / append / other (ms) | memory GB |",
             "|---|---|---|---|---|---|"]
    for name in order:
        c = caches[name]
        runs = [c["runs"][b] for b in sorted(c["runs"])]
        out["caches"].append(dict(c, runs=runs))
        if not runs:
            continue
        best = max(runs, key=lambda r: r["tokens_per_s"])
        st = best["step_ms"]
        ratio = f"{best['tokens_per_s'] / best_base:.2f}x" if best_base else "-"
        maxb = c["max_batch"]
        bmax = f"{maxb} ({maxb / base['max_batch']:.2f}x)" if base and base["max_batch"] and name != "fp16" else str(maxb)
        lines.append(f"| {name} (K{c['k_bits']} V{c['v_bits']}, R {c['residual']}) | {bmax} | {best['tokens_per_s']:.0f} ({best['batch']}) | "
                     f"{ratio} | {st['matmul']:.1f} / {st['attention']:.1f} / {st['append']:.1f} / {st['other']:.1f} | {best['memory_gb']:.1f} |")
    lines += ["", "| cache | batch | tokens/s | decode tokens/s | step ms | matmul | attention | append | other | memory GB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name in order:
        for r in sorted(caches[name]["runs"].values(), key=lambda r: r["batch"]):
            st = r["step_ms"]
            lines.append(f"| {name} | {r['batch']} | {r['tokens_per_s']:.0f} | {r['decode_tokens_per_s']:.0f} | "
                         f"{sum(st.values()):.1f} | {st['matmul']:.1f} | {st['attention']:.1f} | {st['append']:.1f} | "
                         f"{st['other']:.1f} | {r['memory_gb']:.1f} |")
    json.dump(out, open(prefix + ".json", "w"), indent=1)
    open(prefix + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in order:
        runs = sorted(caches[name]["runs"].values(), key=lambda r: r["batch"])
        xs, ys = [r["batch"] for r in runs], [r["tokens_per_s"] for r in runs]
        line, = ax.plot(xs, ys, marker="o", label=name)
        mb = caches[name]["max_batch"]
        if mb in caches[name]["runs"]:
            ax.plot([mb], [caches[name]["runs"][mb]["tokens_per_s"]], marker="*", markersize=14, color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (sequences); * = the largest batch that fits")
    ax.set_ylabel("generated tokens/s")
    m = meta.get("model", {})
    ax.set_title(f"{m.get('layers')}-layer {m.get('dim')}-wide model (Llama-2-7B shape), prompt {meta.get('prompt')}, "
                 f"{meta.get('generated')} generated", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=110)


if __name__ == "__main__":
    main()
