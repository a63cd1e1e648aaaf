"""`tune`'s picture: output tokens/s against the budget, one line per top-K, the
baselines as horizontal lines, at the concurrency the choice is made at (a PNG written
next to the results). Needs matplotlib: the optional extra ``ddtree-deploy[tune]``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only: never a display
import matplotlib.pyplot as plt  # noqa: E402

from ddtree_deploy.tuning import tune  # noqa: E402


def plot_png(opts: tune.TuneOptions, records: Sequence[tune.Record], path: Path, *, title: str = "") -> Path:
    at = opts.choose_at
    done = tune.firsts(records)
    choice = tune.choose(opts, records)
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    for k in opts.topk:
        pts = sorted((c.budget, r.tps(at)) for c, r in done.items()
                     if c.kind == "ddtree" and c.topk == k and r.ok and r.at(at) is not None)
        if pts:
            ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o", label=f"DDTree top-K {k}")
        failed = sorted(c.budget for c, r in done.items() if c.kind == "ddtree" and c.topk == k and not r.ok)
        if failed:
            ax.plot(failed, [0] * len(failed), linestyle="none", marker="x", color="red")
    styles = {"dflash": ("black", "--"), "none": ("grey", ":")}
    for name in opts.baselines:
        r = done.get(tune.Config(name))
        if r is not None and r.ok and r.at(at) is not None:
            color, style = styles[name]
            ax.axhline(r.tps(at), color=color, linestyle=style, label=tune.Config(name).label)
    if choice.best is not None:
        ax.plot([choice.best.budget], [choice.best_tps], marker="*", markersize=16, color="gold",
                markeredgecolor="black", linestyle="none", label="chosen")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(opts.budgets))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("DDTree budget (tree nodes per request)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{title}: throughput at concurrency {at}" if title else f"throughput at concurrency {at}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
