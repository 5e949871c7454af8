"""The report's section on concurrent requests: throughput and speedup against N, latency and acceptance, KV in
use, and the batched cost model's prediction beside each measured speedup; how often that prediction lies within
10% of the measurement is a diagnostic (agreement_section)."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from harness.concurrency.figures import agreement
from harness.report.fmt import ci, f, mib, table

KEYS = ["category", "policy", "parallel", "kv_unified", "draft_label", "gamma_label"]


def _n(r: dict) -> str:
    return f"{r['parallel']}, unified KV" if r.get("kv_unified") else str(r["parallel"])


def _frame(data: dict[str, pl.DataFrame]) -> pl.DataFrame | None:
    conc, sweep = data.get("concurrency"), data.get("sweep")
    if conc is None or sweep is None:
        return None
    cols = [*KEYS, "config", "draft", "speedup", "speedup_lo", "speedup_hi", "tokens_per_s", "acceptance_rate",
            "mean_accepted_len", "alpha", "kv_bytes_per_position", "host_kv_bytes", "device_kv_bytes"]
    return conc.join(sweep.select([c for c in cols if c in sweep.columns]), on=["config", "category"]).sort(
        pl.col("policy") != "greedy", "category", "policy", "draft_label", "gamma_label", "parallel", "kv_unified")


def section(data: dict[str, pl.DataFrame], run_dir: Path, rel: Path) -> list[str]:
    c = _frame(data)
    if c is None or not len(c):
        return []
    spec = c.filter(pl.col("draft") != "none")
    first = [[r["category"], r["policy"], _n(r), r["draft_label"], r["gamma_label"],
              f(r["plain_total_tokens_per_s"], ".1f"), f(r["total_tokens_per_s"], ".1f"), f(r["tokens_per_s"], ".1f"),
              ci(r["speedup"], r["speedup_lo"], r["speedup_hi"], unit="x"), f(r["predicted"], ".2f") + (
                  "x" if r["predicted"] is not None else "")] for r in spec.iter_rows(named=True)]
    second = [[r["category"], r["policy"], _n(r), r["draft_label"], r["gamma_label"],
               f"{f(r['plain_latency_ms'], '.0f')} / {f(r['plain_latency_p95_ms'], '.0f')}",
               f"{f(r['latency_ms'], '.0f')} / {f(r['latency_p95_ms'], '.0f')}",
               f(r["acceptance_rate"], ".0%") + (f" ({r['acceptance_min']:.0%}-{r['acceptance_max']:.0%})"
                                                 if r["acceptance_min"] is not None else ""),
               f(r["mean_accepted_len"], ".2f"), f(r["alpha"], ".3f"), f(r["mean_active"], ".1f")]
              for r in spec.iter_rows(named=True)]
    out = ["## Concurrent requests", "",
           "N requests of a category decode together in one context, each its own sequence, one llama_decode per "
           "step for all of them (their verification blocks when speculating; the draft batched the same way); a "
           "finished request frees its slot for the category's next. Total tok/s: every sequence's tokens over the "
           "time spent in decode steps (prefill left out); per sequence: each request's tokens over the steps it "
           "took part in. Speedup: each request's tokens per ms speculating against plain decoding at the same N, "
           "prompt by prompt, with its 95% interval; predicted: the batched cost model at the measured alpha, its "
           "speculative steps priced as they ran (each sequence's draft catch-up, drafts and verification block, "
           "cut into the graphs llama.cpp decodes them in: one per run of equal shares of consecutive sequences "
           "with a KV buffer each, one for all with a unified KV) from the decode costs the worker measured with "
           "1, 2, 4, ... N sequences of its own context, against the plain step as the plain twins ran it.", ""]
    if not len(spec):
        out += ["No speculative configuration ran with several requests at once.", ""]
    else:
        out += [table(first, ["category", "policy", "N", "draft", "gamma", "plain tok/s (total)",
                              "spec tok/s (total)", "per sequence", "speedup [95% CI]", "predicted"]), "",
                "Latency per request (ms, mean / p95, its prefill included) and acceptance (pooled; the range over "
                "requests in brackets):", "",
                table(second, ["category", "policy", "N", "draft", "gamma", "plain latency", "spec latency",
                               "acceptance", "mean accepted", "alpha", "in flight"]), ""]
    short = c.filter(pl.col("slots_used") < pl.col("parallel")).select("category", "parallel", "slots_used").unique(
        maintain_order=True)
    for r in short.iter_rows(named=True):
        out.append(f"- {r['category']} at N = {r['parallel']}: the category has {r['slots_used']} prompt(s), so at "
                   f"most {r['slots_used']} ran at once.")
    if len(short):
        out.append("")
    out += _kv(c) + _plot(run_dir, rel)
    return out


def agreement_section(data: dict[str, pl.DataFrame]) -> list[str]:
    """The batched cost model's agreement with the measured speedups, beside the run's timing floor: a prediction
    can follow a measurement no closer than two timings of the same work follow each other (a diagnostic)."""
    c = _frame(data)
    if c is None or not len(c):
        return []
    line = agreement_line(list(c.filter(pl.col("draft") != "none").iter_rows(named=True)))
    return ["## Concurrent requests: predicted against measured", "",
            "The predicted column of the report's concurrent requests, against the measured speedup.", "", line,
            ""] if line else []


def agreement_line(rows: list[dict]) -> str:
    """The agreement of rows' predictions with their measured speedups, beside their timing floor ("" without a
    prediction)."""
    a = agreement(rows)
    if not a["predicted_of"]:
        return ""
    line = f"Predicted within 10% of the measured speedup in {a['predicted']} of {a['predicted_of']} row(s)."
    if a["twice_of"]:
        line += (f" The same plain work timed twice (each row's plain twins against the plain baseline "
                 f"configuration's run of the same requests at the same N, in another worker) agrees within 10% in "
                 f"{a['twice']} of {a['twice_of']} (the largest gap {a['twice_max']:.0%}): the measured speedups "
                 "move that much by themselves.")
        if a["twice"] < a["twice_of"]:
            line += " Longer rows (a larger `--max-tokens` or `--repeat`) move less."
    return line


def _kv(c: pl.DataFrame) -> list[str]:
    """KV cells in use at the peak, per N: what the sequences held, at the configuration's bytes per cell."""
    keys = ["parallel", "kv_unified", "draft_label"]
    m = c.filter(pl.col("peak_positions").is_not_null()).group_by(keys).agg(
        pl.col("peak_positions").max(), pl.col("kv_bytes_per_position").first(),
        pl.col("host_kv_bytes").first(), pl.col("device_kv_bytes").first()).sort(keys)
    rows = [[_n(r), r["draft_label"], r["peak_positions"],
             mib(r["peak_positions"] * r["kv_bytes_per_position"]) if r["kv_bytes_per_position"] else "",
             mib((r["host_kv_bytes"] or 0) + (r["device_kv_bytes"] or 0))] for r in m.iter_rows(named=True)]
    return ["KV cache per N: the target's cells in use at the peak (every sequence's prompt and output so far, "
            "and the step's blocks), their bytes for both models, and what llama.cpp allocated (n_ctx, shared "
            "among the N sequences):", "",
            table(rows, ["N", "draft", "cells in use (peak)", "KV in use", "KV allocated"]), ""]


PLOT = "concurrency.png"  # in the section on concurrent requests, which `harness archive` keeps


def _plot(run_dir: Path, rel: Path) -> list[str]:
    p = run_dir / "plots" / PLOT
    return [f"![Speedup against N]({rel / 'plots' / PLOT})", ""] if p.exists() else []


def plot(data: dict[str, pl.DataFrame], out: Path) -> Path | None:
    """Speedup against N, a panel per policy, a line per category, draft and gamma (dashed: predicted)."""
    from harness import plots
    c = _frame(data)
    if c is None:
        return None
    spec = c.filter((pl.col("draft") != "none") & pl.col("speedup").is_not_null())
    if not len(spec):
        return None
    plt = plots._plt()
    pols = spec["policy"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(pols), figsize=(5 * len(pols), 3.8), squeeze=False)
    for ax, pol in zip(axes[0], pols):
        for (cat, draft, g, kvu), line in spec.filter(pl.col("policy") == pol).group_by(
                ["category", "draft_label", "gamma_label", "kv_unified"], maintain_order=True):
            line = line.sort("parallel")
            drawn = ax.plot(line["parallel"], line["speedup"], marker="o",
                            label=f"{cat} {draft.replace('qwen2.5-coder-', '')} g={g}{' unified KV' if kvu else ''}")
            ax.plot(line["parallel"], line["predicted"], linestyle="--", color=drawn[0].get_color(), linewidth=0.8)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(pol)
        ax.set_xlabel("N (requests decoded together)")
    axes[0][0].set_ylabel("speedup (dashed: predicted)")
    axes[0][-1].legend(fontsize=6)
    return plots.save(fig, out / PLOT)
