"""PNG plots for the Markdown report (needs the optional 'plot' extra: matplotlib)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path) -> Path:
    from harness.errors import naming
    fig.tight_layout()
    try:
        with naming(path):  # a full disk names the PNG (cli.main makes it one line)
            fig.savefig(path, dpi=90, bbox_inches="tight")  # long tick labels kept whole
    finally:
        _plt().close(fig)
    return path


def gamma_curves(sweep: pl.DataFrame, out: Path) -> Path | None:
    """Acceptance and tokens/s against gamma, one panel pair per category, a line per draft and policy."""
    spec = sweep.filter((pl.col("draft") != "none") & ~pl.col("adaptive"))
    if not len(spec):
        return None
    plt = _plt()
    cats = spec["category"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(2, len(cats), figsize=(3.2 * len(cats), 5.5), squeeze=False)
    for j, cat in enumerate(cats):
        g = spec.filter(pl.col("category") == cat)
        for (draft, pol), line in g.group_by(["draft", "policy"], maintain_order=True):
            line = line.sort("gamma")
            label = f"{draft.replace('qwen2.5-coder-', '')} {pol}"
            axes[0][j].plot(line["gamma"], line["acceptance_rate"], marker="o", label=label)
            axes[1][j].plot(line["gamma"], line["tokens_per_s"], marker="o", label=label)
        base = sweep.filter((pl.col("draft") == "none") & (pl.col("category") == cat))
        for b in base.iter_rows(named=True):
            axes[1][j].axhline(b["tokens_per_s"], linestyle="--", linewidth=0.8, color="grey")
        axes[0][j].set_title(cat)
        axes[0][j].set_ylim(0, 1.05)
        axes[1][j].set_xlabel("gamma")
    axes[0][0].set_ylabel("acceptance (accepted/proposed)")
    axes[1][0].set_ylabel("tokens/s (dashed: plain)")
    axes[0][-1].legend(fontsize=6)
    return save(fig, out / "gamma.png")


def predicted_vs_measured(points: list[tuple[float, float, str]], out: Path) -> Path | None:
    if not points:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for pred, meas, cat in points:
        ax.scatter(pred, meas, s=14)
        ax.annotate(cat[:4], (pred, meas), fontsize=6)
    hi = max(max(p for p, _, _ in points), max(m for _, m, _ in points)) * 1.1
    ax.plot([0, hi], [0, hi], color="grey", linewidth=0.8)
    ax.set_xlabel("predicted speedup")
    ax.set_ylabel("measured speedup")
    return save(fig, out / "cost_model.png")


def calibration(run_dir: Path, out: Path) -> Path | None:
    cals = [json.loads(p.read_text()) for p in sorted((run_dir / "calibration").glob("*.json"))]
    if not cals:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for c in cals:
        for ctx, ms in zip(c["contexts"], c["ms_by_context"]):
            ax.plot(c["k"], ms, marker="o", markersize=3, label=f"{c['model']} @{ctx} ({c['threads']} thr)")
    ax.set_xlabel("tokens per llama_decode (all logits)")
    ax.set_ylabel("ms")
    ax.legend(fontsize=6)
    return save(fig, out / "calibration.png")


def verdicts(v: pl.DataFrame | None, out: Path) -> Path | None:
    """The first screen's plot: per category and policy, the answer's configuration's speedup with its 95%
    interval against 1.00x (plain decoding), coloured by its verdict."""
    if v is None or not len(v) or v["lo"].is_null().all():
        return None
    plt = _plt()
    v = v.filter(pl.col("speedup").is_not_null())
    # every row names its target, by what sets it apart from the others (its quantization, for one model's)
    names = v["target"].unique(maintain_order=True).to_list() if "target" in v.columns else []
    cut = len(os.path.commonprefix(names)) if len(names) > 1 else None
    labels = [(f"{r['target'][cut:]}: " if cut is not None else "")
              + f"{'every prompt' if r['category'] == 'all' else r['category']} ({r['policy']})"
              for r in v.iter_rows(named=True)]
    colour = {"speculate": "tab:green", "plain decoding": "tab:red", "no gain worth having": "tab:blue",
              "inconclusive": "tab:grey"}
    fig, ax = plt.subplots(figsize=(7.5, 0.3 * len(v) + 1.4))
    for i, r in enumerate(v.iter_rows(named=True)):
        c = colour.get(r["verdict"], "tab:orange")
        if r["lo"] is not None:
            ax.plot([r["lo"], r["hi"]], [i, i], color=c, linewidth=2)
        ax.plot([r["speedup"]], [i], "o", color=c)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(v)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over plain decoding (the answer's configuration, 95% interval)", fontsize=8)
    ax.set_title("green: speculate, red: plain decoding, blue: no gain worth having,\ngrey: inconclusive, "
                 "orange: no verdict", fontsize=8)
    return save(fig, out / "verdicts.png")
