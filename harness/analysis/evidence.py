"""From trace frames to the bootstrap's input: per (configuration, category), per prompt, each speculative
generation's steps beside its plain twin's, and the intervals of every row."""
from __future__ import annotations

import math

import numpy as np
import polars as pl

from harness.analysis.intervals import Generation, Row, row_intervals, step_matrix, widened
from harness.analysis.metrics import GEN_KEYS, REACHED
INTERVAL_FIGURES = ("speedup", "acceptance_rate", "mean_accepted_len", "alpha")


def generation_steps(steps: pl.DataFrame, gens: pl.DataFrame, spec: bool) -> dict[tuple, np.ndarray]:
    """Per generation (GEN_KEYS), its steps as intervals.step_matrix rows."""
    if not len(steps) or not len(gens):
        return {}
    s = steps.with_columns((pl.col("draft_ms") + pl.col("verify_ms") + pl.col("overhead_ms")).alias("step_ms"),
                           REACHED.alias("reached"),
                           pl.col("alpha").list.head(REACHED).list.sum().alias("reached_alpha"))
    g = s.sort("step").group_by(GEN_KEYS, maintain_order=True).agg(
        "emitted", "step_ms", "accepted", "proposed", "reached_alpha", "reached")
    g = g.join(gens.select(*GEN_KEYS, "gen_ms"), on=GEN_KEYS, how="inner")
    return {tuple(r[k] for k in GEN_KEYS): step_matrix(r["emitted"], r["step_ms"], r["accepted"], r["proposed"],
                                                       r["reached_alpha"], r["reached"], r["gen_ms"], spec)
            for r in g.iter_rows(named=True)}


def row_evidence(spec: dict[tuple, np.ndarray], twins: dict[tuple, np.ndarray]) -> dict[tuple, Row]:
    """(config, category) -> Row of the speculative generations that have a plain twin (same keys)."""
    rows: dict[tuple, dict[str, list[Generation]]] = {}
    for key, m in spec.items():
        twin = twins.get(key)
        if twin is None:
            continue
        rows.setdefault(key[:2], {}).setdefault(key[2], []).append(Generation(m, twin))
    return {k: Row(list(by_prompt.values())) for k, by_prompt in rows.items()}


def intervals_frame(rows: dict[tuple, Row], pace: float = 0.0) -> pl.DataFrame:
    """One line per (config, category): prompts, and each figure's _lo, _hi and _se (seeded by the row's key).
    pace: the spread of the machine's pace between a generation and its twin (metrics.pace_spread), added to the
    speedup's where the row has one prompt: bootstrapping its steps cannot see it, while across prompts it is in
    how their pairs differ."""
    out = []
    for (config, category), row in rows.items():
        iv = row_intervals(row, f"{config}/{category}")
        if iv["prompts"] == 1:
            iv = widened(iv, pace / math.sqrt(len(row.prompts[0])))
        out.append({"config": config, "category": category, "prompts": iv["prompts"]}
                   | {f"{f}_{s}": iv[f"{f}_{s}"] for f in INTERVAL_FIGURES for s in ("lo", "hi", "se")})
    schema = {"config": pl.String, "category": pl.String, "prompts": pl.Int64} | {
        f"{f}_{s}": pl.Float64 for f in INTERVAL_FIGURES for s in ("lo", "hi", "se")}
    return pl.DataFrame(out, schema=schema)
