"""The cost model against the measurements: predicted speedup per row, the recommended gamma, adaptive gamma
against the best fixed one."""
from __future__ import annotations

from pathlib import Path

import polars as pl


def overhead_per_row(r: dict) -> float:
    """A sweep row's loop overhead per verified row (Costs.overhead_ms_per_row): each target call verifies its
    proposals and one row more."""
    calls = r["target_calls"]
    return (r["overhead_ms_per_call"] or 0.0) * calls / (calls + r["proposed"]) if calls else 0.0


def _costs_for(r: dict, run_dir: Path, measured: dict | None):
    from dataclasses import replace

    from harness.calibrate import costs_at
    from harness.costmodel import read
    from harness.engine import EngineConfig
    from harness.specs import parse_draft
    oh = overhead_per_row(r)
    # the plain twins' ms per token, less the loop's own cost of its row: Costs.step_ms(0) adds it back
    plain_ms = 1 / r["ref_tokens_per_ms"] - oh if r["ref_tokens_per_ms"] else None
    if measured is not None:  # measured in the row's worker, before its generations (and after, pooled)
        rec = read(measured)
        costs = rec.costs(r["context"], oh)
        if plain_ms and rec.contexts > 1:
            # plain decoding costs what the row's plain twins took per token, on the real prompts; the blocks and
            # the draft what was measured, interpolated to the row's context
            return replace(costs, target_ms=[plain_ms, *costs.target_ms[1:]])
    else:
        draft = parse_draft(r["draft"]).model
        # the calibration is interpolated to the mean tokens in the cache during generation: costs grow with it
        costs = costs_at(run_dir / "calibration", r["target"], draft,
                         EngineConfig(threads=r["threads"]).resolved_threads(), r["ngl"], r["ngl_draft"], r["context"],
                         oh)
    if costs is None or not plain_ms:
        return costs
    # a calibration from the start of the run (or a worker's, at one context only: runs from before two were)
    # gives the curve's shape; its level comes from the row's plain reference, measured on the real prompts
    # (filler text at an interpolated context misjudges long prompts)
    level = plain_ms / costs.target_ms[0]
    return replace(costs, target_ms=[x * level for x in costs.target_ms])


def cost_model(sweep: pl.DataFrame, run_dir: Path, measured: dict[str, dict]) -> dict[str, pl.DataFrame]:
    """Predicted speedup from measured costs (the row's worker's, else the run's calibration) and measured
    alpha against the measured speedup, per speculative row; the gamma the model recommends per (category,
    policy, draft); adaptive gamma against the best fixed one."""
    from harness.costmodel import best_gamma, predicted_speedup
    rows, best = [], {}
    spec = sweep.filter((pl.col("draft") != "none") & pl.col("alpha").is_not_null())
    for r in spec.sort(["category", "policy", "draft", "gamma"]).iter_rows(named=True):
        calibrated = _costs_for(r, run_dir, None)  # the whole curve, k up to the calibration's k-max
        costs = calibrated if r["adaptive"] or r["config"] not in measured else \
            _costs_for(r, run_dir, measured[r["config"]])
        if costs is None or r["gamma"] + 1 > len(costs.target_ms):
            continue
        share = r["verify_steps"] / r["target_calls"] if r["target_calls"] else 1.0  # steps that proposed
        pred = None if r["adaptive"] else predicted_speedup(r["alpha"], r["gamma"], costs, share)
        rows.append({k: r[k] for k in ("category", "policy", "draft", "draft_label", "gamma", "gamma_label", "adaptive",
                                       "alpha", "speedup", "tokens_per_call_rse")}
                    | {"predicted": pred, "error": pred / r["speedup"] - 1 if pred and r["speedup"] else None,
                       "pooled": measured.get(r["config"], {}).get("moments", 1) > 1})
        if not r["adaptive"]:  # the whole calibrated curve where the run has one, else the worker's own
            best.setdefault((r["category"], r["policy"], r["draft_label"]), (r["alpha"], calibrated or costs))
    if not rows:
        return {}
    rec = [{"category": c, "policy": p, "draft": d, "gamma": best_gamma(a, costs, max(len(costs.target_ms) - 1, 1))}
           for (c, p, d), (a, costs) in best.items()]
    auto_rows = []  # an adaptive run that chose plain decoding throughout has no alpha: it still counts here
    for (cat, pol, draft), g in sweep.filter(pl.col("draft") != "none").group_by(
            ["category", "policy", "draft_label"], maintain_order=True):
        auto, fixed = g.filter(pl.col("adaptive")), g.filter(~pl.col("adaptive"))
        if not len(auto) or not len(fixed):
            continue
        bar = max(fixed["speedup"].max() or 0.0, 1.0)
        got = auto["speedup"][0]
        auto_rows.append({"category": cat, "policy": pol, "draft": draft, "auto": got,
                          "best_fixed": fixed["speedup"].max(), "ratio": got / bar, "within_5pct": got >= 0.95 * bar})
    out = {"cost_model": pl.DataFrame(rows, infer_schema_length=None),
           "recommended": pl.DataFrame(rec, infer_schema_length=None)}
    if auto_rows:
        out["adaptive"] = pl.DataFrame(auto_rows, infer_schema_length=None)
    return out
