"""The figures of a run, as frames, from its directory alone: per configuration x category, recomputed from the
raw traces every time (what the Markdown, the exports and --check are made of)."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from harness.analysis import metrics, verdict
from harness.rundir import DRIFT_DIR, PAIRED_DIR, finished, load_records, read_plan
from harness.sampling import Policy

BASE_KEYS = ["target", "policy", "ngl", "threads", "category"]


def config_frame(plan: dict, results: dict[str, dict]) -> pl.DataFrame:
    from harness.plan import Instance
    rows = []
    for d in plan["instances"]:
        inst = Instance(**d)
        res = results.get(inst.id, {})
        rows.append({"config": inst.id, "target": inst.target, "draft": inst.draft, "gamma": inst.gamma,
                     "adaptive": inst.adaptive, "gamma_label": inst.gamma_label,
                     "policy": Policy(**inst.policy).label, "ngl": inst.ngl, "ngl_draft": inst.ngl_draft,
                     "threads": inst.threads, "status": res.get("status", "not run"),
                     "error": res.get("error", ""), "peak_rss_bytes": res.get("peak_rss_bytes"),
                     "kv_bytes": res.get("kv_bytes"), "target_bytes": res.get("target_bytes"),
                     "draft_bytes": res.get("draft_bytes")})
    return pl.DataFrame(rows, infer_schema_length=None)


def _compact(df: pl.DataFrame, key_col: str, val_col: str, fmt: str) -> pl.DataFrame:
    return df.group_by(["config", "category"], maintain_order=True).agg(
        pl.format("{}:{}", pl.col(key_col).cast(pl.String), pl.col(val_col).map_elements(
            lambda v: format(v, fmt), return_dtype=pl.String)).str.join(" ").alias(f"{key_col}_{val_col}"))


def compute(run_dir: Path) -> dict[str, pl.DataFrame]:
    plan = read_plan(run_dir)
    results = finished(run_dir)
    cfg = config_frame(plan, results)
    ok = {c for c, r in results.items() if r.get("status") == "ok"}
    records = load_records(run_dir, ok)
    steps, gens = metrics.frames(records)
    out = {"configs": cfg}
    if not len(gens):
        return out
    keys = ["config", "category"]
    acc = metrics.acceptance(steps, keys)
    tp = metrics.throughput(gens, keys)
    sweep = tp.join(acc, on=keys, how="left").join(cfg.drop("error"), on="config", how="left")
    div = metrics.safe_div
    sweep = sweep.with_columns(
        div(pl.col("draft_ms"), pl.col("verify_steps")).alias("draft_ms_per_step"),
        div(pl.col("verify_ms"), pl.col("target_calls")).alias("verify_ms_per_call"),
        div(pl.col("overhead_ms"), pl.col("target_calls")).alias("overhead_ms_per_call"),
        div(pl.col("draft_ms") + pl.col("verify_ms") + pl.col("overhead_ms"), pl.col("target_calls")).alias("step_ms"),
    )
    base = sweep.filter(pl.col("draft") == "none").select(
        *BASE_KEYS, pl.col("tokens_per_ms").alias("base_tokens_per_ms"),
        pl.col("tokens_per_s").alias("base_tokens_per_s"))
    sweep = sweep.join(base, on=BASE_KEYS, how="left")
    paired = side_runs(run_dir / PAIRED_DIR, run_dir)  # recorded with the configuration it ran in
    if paired is not None:
        sweep = sweep.join(paired.select(*keys, pl.col("tokens_per_ms").alias("paired_tokens_per_ms"),
                                         pl.col("tokens_per_s").alias("paired_tokens_per_s")), on=keys, how="left")
    else:
        sweep = sweep.with_columns(pl.lit(None, pl.Float64).alias("paired_tokens_per_ms"),
                                   pl.lit(None, pl.Float64).alias("paired_tokens_per_s"))
    # the reference plain speed of each row: its paired plain runs where the run has them, else the category's
    # plain baseline configuration
    sweep = sweep.with_columns(
        pl.coalesce("paired_tokens_per_ms", "base_tokens_per_ms").alias("ref_tokens_per_ms"),
        pl.coalesce("paired_tokens_per_s", "base_tokens_per_s").alias("ref_tokens_per_s"),
        (pl.col("tokens_per_ms") / pl.col("base_tokens_per_ms")).alias("speedup_vs_baseline"),
    ).with_columns((pl.col("tokens_per_ms") / pl.col("ref_tokens_per_ms")).alias("speedup"))
    end = closing_baselines(run_dir, cfg)
    if end is not None:
        sweep = sweep.join(end, on=BASE_KEYS, how="left").with_columns(
            (pl.col("base_end_tokens_per_s") / pl.col("base_tokens_per_s")).alias("drift"))
    spec = steps.filter(pl.col("proposed") > 0)
    if len(spec):
        for extra in (_compact(metrics.per_position(spec, keys), "pos", "accept_prob", ".2f"),
                      _compact(metrics.rejection_histogram(spec, keys), "rejected_at", "steps", "d"),
                      _compact(metrics.by_confidence(spec, keys), "target_conf", "accept_prob", ".2f")):
            sweep = sweep.join(extra, on=keys, how="left")
    be = [None if r["adaptive"] else verdict.break_even_rate(
        r["step_ms"] or 0, 1 / r["ref_tokens_per_ms"] if r["ref_tokens_per_ms"] else 0, r["gamma"])
        for r in sweep.iter_rows(named=True)]
    sweep = sweep.with_columns(pl.Series("break_even_rate", be, dtype=pl.Float64))
    out["sweep"] = sweep
    out["equivalence"] = equivalence(gens, metrics.frame(records, "divergence"), cfg)
    out |= cost_model(sweep, run_dir)
    return out


def side_runs(d: Path, results: Path | None = None) -> pl.DataFrame | None:
    """Throughput per configuration and category of the generations in a side directory (drift/, paired/) of
    the configurations that finished (results.jsonl of d, or another run directory's); None without any."""
    res = results or d
    ok = {c for c, r in finished(res).items() if r.get("status") == "ok"} if d.is_dir() else set()
    _, gens = metrics.frames(load_records(d, ok))
    return metrics.throughput(gens, ["config", "category"]) if len(gens) else None


def closing_baselines(run_dir: Path, cfg: pl.DataFrame) -> pl.DataFrame | None:
    """Plain tokens/s per baseline key from the baselines bench ran again after the sweep; None without them."""
    tp = side_runs(run_dir / DRIFT_DIR)
    if tp is None:
        return None
    tp = tp.join(cfg.select("config", *BASE_KEYS[:-1]), on="config")
    return tp.select(*BASE_KEYS, pl.col("tokens_per_s").alias("base_end_tokens_per_s"))


def equivalence(gens: pl.DataFrame, divergences: pl.DataFrame, cfg: pl.DataFrame) -> pl.DataFrame:
    """Greedy speculative outputs against the greedy baseline of the same target, offload and prompt; each
    divergence classified by the kernel check its worker recorded (harness.divergence)."""
    g = gens.join(cfg.select("config", "target", "draft", "gamma", "policy", "ngl", "threads"), on="config")
    g = g.filter(pl.col("policy") == "greedy")
    base = g.filter(pl.col("draft") == "none")
    if not len(base):
        return pl.DataFrame()
    bkey = ["target", "ngl", "threads", "prompt_id", "repeat"]
    btok = {tuple(r[k] for k in bkey): r["tokens"] for r in base.iter_rows(named=True)}
    found = {(r["config"], r["prompt_id"], r["repeat"]): r for r in divergences.iter_rows(named=True)}
    rows = []
    for r in g.filter(pl.col("draft") != "none").iter_rows(named=True):
        b = btok.get(tuple(r[k] for k in bkey))
        if b is None:
            continue
        c = metrics.classify(r["tokens"], b, found.get((r["config"], r["prompt_id"], r["repeat"])))
        rows.append({"config": r["config"], "category": r["category"], "prompt_id": r["prompt_id"], **c})
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, infer_schema_length=None).group_by(["config", "category"], maintain_order=True).agg(
        pl.len().alias("generations"), (pl.col("equal").mean() * 100).alias("exact_match_pct"),
        (pl.col("kind") == "kernel near-tie").sum().alias("kernel_near_ties"),
        (pl.col("kind") == "mismatch").sum().alias("mismatches"),
        (pl.col("kind") == "unchecked").sum().alias("unchecked"))


def _costs_for(r: dict, run_dir: Path):
    from dataclasses import replace

    from harness.calibrate import costs_at
    from harness.engine import EngineConfig
    from harness.pair import parse_ngram
    draft = None if parse_ngram(r["draft"]) is not None else r["draft"]
    # the calibration is interpolated to the mean tokens in the cache during generation: costs grow with it
    costs = costs_at(run_dir / "calibration", r["target"], draft, EngineConfig(threads=r["threads"]).resolved_threads(),
                     r["ngl"], r["ngl_draft"], r["context"], r["overhead_ms_per_call"] or 0.0)
    if costs is None or not r["ref_tokens_per_ms"]:
        return costs
    # the calibration gives the curve's shape; its level comes from the row's plain reference, measured on
    # the real prompts (filler text at an interpolated context misjudges long prompts)
    level = 1 / r["ref_tokens_per_ms"] / costs.target_ms[0]
    return replace(costs, target_ms=[x * level for x in costs.target_ms])


def cost_model(sweep: pl.DataFrame, run_dir: Path) -> dict[str, pl.DataFrame]:
    """Predicted speedup from calibrated costs and measured alpha against the measured one, per speculative row;
    the gamma the model recommends per (category, policy, draft); adaptive gamma against the best fixed one."""
    from harness.costmodel import best_gamma, predicted_speedup
    rows, best = [], {}
    spec = sweep.filter((pl.col("draft") != "none") & pl.col("alpha").is_not_null())
    for r in spec.sort(["category", "policy", "draft", "gamma"]).iter_rows(named=True):
        costs = _costs_for(r, run_dir)
        if costs is None or r["gamma"] + 1 > len(costs.target_ms):
            continue
        pred = None if r["adaptive"] else predicted_speedup(r["alpha"], r["gamma"], costs)
        rows.append({k: r[k] for k in ("category", "policy", "draft", "gamma", "gamma_label", "adaptive", "alpha",
                                       "speedup", "tokens_per_call_rse")}
                    | {"predicted": pred, "error": pred / r["speedup"] - 1 if pred and r["speedup"] else None})
        if not r["adaptive"]:
            best.setdefault((r["category"], r["policy"], r["draft"]), (r["alpha"], costs))
    if not rows:
        return {}
    rec = [{"category": c, "policy": p, "draft": d, "gamma": best_gamma(a, costs, max(len(costs.target_ms) - 1, 1))}
           for (c, p, d), (a, costs) in best.items()]
    auto_rows = []  # an adaptive run that chose plain decoding throughout has no alpha: it still counts here
    for (cat, pol, draft), g in sweep.filter(pl.col("draft") != "none").group_by(["category", "policy", "draft"],
                                                                                maintain_order=True):
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
