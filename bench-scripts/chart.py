#!/usr/bin/env python3
"""chart.py RESULTS.json OUT.png — the e2e benchmark as two bar panels (prefill, decode tokens/s),
one bar per arm, the value and its ratio to the CPU arm on each bar, "not available" where an arm
has no number, and the label (simulator / board) in the title."""
import json, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

res = json.load(open(sys.argv[1]))
arms = res["arms"]
names = [a["name"].replace(" (", "\n(") for a in arms]
cpu = next((a for a in arms if a["key"] == "cpu" and "na" not in a), None)
colors = {"cpu": "#7f7f7f", "ork": "#1f77b4", "npu": "#2ca02c", "gpu": "#d62728"}

fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
for ax, key, title in ((axes[0], "pp", f"prefill pp{res['p']}"), (axes[1], "tg", f"decode tg{res['n']}")):
    vals = [a.get(key) if "na" not in a else None for a in arms]
    top = max([v for v in vals if v] or [1.0])
    xs = range(len(arms))
    ax.bar(xs, [v or 0 for v in vals], color=[colors.get(a["key"], "#999") for a in arms])
    for x, a, v in zip(xs, arms, vals):
        if v is None:
            ax.text(x, top * 0.04, "not\navailable", ha="center", va="bottom", fontsize=10, color="#555")
        else:
            txt = f"{v:.2f}"
            if cpu and a is not cpu and cpu.get(key):
                txt += f"\n{v / cpu[key]:.2f}× CPU"
            ax.text(x, v + top * 0.02, txt, ha="center", va="bottom", fontsize=10)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, fontsize=9)
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel("tokens / s")
    ax.set_title(title, fontsize=12)
    ax.grid(axis="y", alpha=0.3)
task = f", {res['taskset']}" if res.get("taskset") else ""
fig.suptitle(f"{res['model']}: llama-bench -t {res['threads']} -r {res['r']}, median of {res.get('rounds', 1)} rounds{task}\n{res['label']}", fontsize=12)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
