"""The figures of a run, as frames, from its directory alone: per configuration x category, recomputed from the
raw traces every time (what the Markdown, the exports and --check are made of)."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from harness.analysis import metrics, verdict
from harness.analysis.predict import ALL
from harness.analysis.evidence import generation_steps, intervals_frame, row_evidence
from harness.concurrency.figures import concurrency_frame
from harness.plan import Params, prompt_pool
from harness.report import llamaserver
from harness.report.configs import config_frame, units_frame
from harness.report.costs import cost_model
from harness.report.verdicts import LEVEL_BASELINE, noise_frame, replay_levels, verdicts, verdicts_frame
from harness.rundir import (DRIFT_DIR, FIDELITY_FILE, PAIRED_DIR, REPLAY_DIR, finished, load_records, noise_records,
                            ok_units, read_plan)

BASE_KEYS = ["target", "policy", "ngl", "threads", "setup", "category"]


def _compact(df: pl.DataFrame, key_col: str, val_col: str, fmt: str) -> pl.DataFrame:
    return df.group_by(["config", "category"], maintain_order=True).agg(
        pl.format("{}:{}", pl.col(key_col).cast(pl.String), pl.col(val_col).map_elements(
            lambda v: format(v, fmt), return_dtype=pl.String)).str.join(" ").alias(f"{key_col}_{val_col}"))


def compute(run_dir: Path) -> dict[str, pl.DataFrame]:
    plan = read_plan(run_dir)
    results = finished(run_dir)
    cfg = config_frame(plan, results)
    ok = ok_units(run_dir)
    m = measured(run_dir, cfg, ok)
    out = {"configs": cfg, "units": units_frame(results)}
    if (run_dir / FIDELITY_FILE).exists():  # the targets against the first one, when a run sweeps several
        out["fidelity"] = pl.DataFrame(json.loads((run_dir / FIDELITY_FILE).read_text()), infer_schema_length=None)
    if m is None:
        return out
    sweep, records, p_records, gens = m["sweep"], m["records"], m["p_records"], m["gens"]
    out["sweep"] = sweep
    out["equivalence"] = equivalence(gens, metrics.frame(records, "divergence"), cfg)
    out["noise"] = noise_frame(noise_records(run_dir), m["p_gens"], cfg)
    out["verdicts"] = run_verdicts(run_dir, plan, results, cfg, sweep, out["noise"])
    from harness.calibrate import unit_costs
    own_costs = unit_costs(records)
    out |= cost_model(sweep.filter(pl.col("parallel") == 1), run_dir, own_costs)
    conc = concurrency_frame(sweep, records, p_records, base_configs(cfg))
    if conc is not None:
        out["concurrency"] = conc
    out |= replay_frames(run_dir, plan, sweep, gens, m["p_gens"], cfg, own_costs, out["noise"])
    if not len(out.get("pooled_verdicts", ())):
        out |= timed_pooled(run_dir, plan, cfg, ok, m, out)
    out["timing_floor"] = m["timing_floor"]
    if plan["params"].get("engine") == "server":
        out["server_pooled"] = llamaserver.pooled(records, p_records, cfg, out["noise"])
    server = llamaserver.frame(run_dir)  # the answers measured in llama-server (crosscheck, bench's check)
    if server is not None:
        out["llama_server"] = server
    return out


def measured(run_dir: Path, cfg: pl.DataFrame, units: set[str], pool: bool = False,
             read: tuple[list, list] | None = None) -> dict | None:
    """The sweep (per configuration x category: throughput, acceptance, intervals) from the given units' traces
    (read: their records and their paired records, where the caller has them), with the frames it was made of;
    None where they hold no generation. pool: every category as one (ALL)."""
    records, p_records = read or (load_records(run_dir, units),
                                  load_records(run_dir / PAIRED_DIR, units))  # each with its configuration's id
    (steps, gens), (p_steps, p_gens) = (
        tuple(f.with_columns(pl.lit(ALL).alias("category")) if pool and "category" in f.columns else f
              for f in metrics.frames(r)) for r in (records, p_records))
    if not len(gens):
        return None
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
    paired = metrics.throughput(p_gens, keys) if len(p_gens) else None
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
    server = "server_totals" in steps.columns  # llama-server's requests: one step of totals each (serverunit)
    if len(spec) and not server:
        for extra in (_compact(metrics.per_position(spec, keys), "pos", "accept_prob", ".2f"),
                      _compact(metrics.rejection_histogram(spec, keys), "rejected_at", "steps", "d"),
                      _compact(metrics.by_confidence(spec, keys), "target_conf", "accept_prob", ".2f")):
            sweep = sweep.join(extra, on=keys, how="left")
    be = [None if r["adaptive"] else verdict.break_even_rate(
        r["step_ms"] or 0, 1 / r["ref_tokens_per_ms"] if r["ref_tokens_per_ms"] else 0, r["gamma"])
        for r in sweep.iter_rows(named=True)]
    sweep = sweep.with_columns(pl.Series("break_even_rate", be, dtype=pl.Float64))
    single = cfg.filter(pl.col("parallel") == 1)["config"].to_list()  # a batched step serves several prompts
    floor = metrics.timing_floor(steps.filter(pl.col("config").is_in(single)) if len(steps) else steps, p_steps)
    sweep = sweep.join(row_intervals(steps, gens, p_steps, p_gens, cfg, metrics.pace_spread(floor)), on=keys,
                       how="left")
    if server:  # what only the steps could say stays unknown, and one prompt's totals have no spread to draw on
        sweep = sweep.with_columns(pl.lit(None, sweep.schema[c]).alias(c) for c in PER_STEP if c in sweep.columns)
        spread = [c for c in sweep.columns if c.endswith(("_lo", "_hi", "_se"))]
        sweep = sweep.with_columns(pl.when(pl.col("prompts") == 1).then(None).otherwise(pl.col(c)).alias(c)
                                   for c in spread)
    return {"sweep": sweep, "records": records, "p_records": p_records, "gens": gens, "p_gens": p_gens,
            "timing_floor": floor}


PER_STEP = ("target_calls", "verify_steps", "tokens_per_call", "tokens_per_call_rse", "alpha", "alpha_lo", "alpha_hi",
            "alpha_se", "mean_accepted_len", "mean_accepted_len_lo", "mean_accepted_len_hi", "mean_accepted_len_se",
            "draft_ms", "verify_ms", "overhead_ms", "draft_ms_per_step", "verify_ms_per_call", "overhead_ms_per_call",
            "step_ms", "break_even_rate")


def run_verdicts(run_dir: Path, plan: dict, results: dict[str, dict], cfg: pl.DataFrame, sweep: pl.DataFrame,
                 noise: pl.DataFrame) -> pl.DataFrame:
    """The timed verdicts at the run's least gain worth having. A run that added rounds until confident is
    judged look by look, each round's verdicts from the rounds up to it at that look's spent level, a group
    keeping the first verdict that settled it (analysis.sequential)."""
    from harness.analysis.sequential import first_settled, look_level
    from harness.report.verdicts import GROUP
    params = plan.get("params", {})
    rules = {"min_gain": params.get("min_gain", verdict.MIN_GAIN), "tried": plan.get("timed_in_sample")}
    rounds = plan.get("rounds") or [plan.get("prompt_ids", [])]
    if not params.get("until_confident"):
        return verdicts(sweep, noise, **rules)
    n_max = pool_sizes(plan)
    before: dict = {}  # each group's prompts at its previous look

    def key(r: dict) -> tuple:
        return tuple(r[k] for k in GROUP)

    def level_of(group: dict, n: int) -> float:
        return look_level(n, before.get(key(group), 0), n_max.get(group["category"], n))
    looks = []
    for last in range(len(rounds)):
        units = {u for u, r in results.items() if r.get("status") == "ok" and r.get("round", 0) <= last}
        m = sweep if last == len(rounds) - 1 else (measured(run_dir, cfg, units) or {}).get("sweep")
        if m is None:
            continue
        v = verdicts(m, noise, level_of=level_of, **rules)
        looks.append(v.to_dicts())
        before |= {key(r): r["group_prompts"] for r in looks[-1]}
    rows = first_settled(looks, key)
    return verdicts_frame(rows) if rows else pl.DataFrame()


def timed_pooled(run_dir: Path, plan: dict, cfg: pl.DataFrame, units: set[str], m: dict,
                 out: dict) -> dict[str, pl.DataFrame]:
    """A run without a replay: its timed verdicts over every category at once (category ALL; the bottom line's),
    or its one category's where it measured one. m: what measured gave for its categories apart."""
    sweep = m["sweep"]
    if sweep["category"].n_unique() == 1:
        return {"sweep_pooled": sweep, "timed_pooled_verdicts": out["verdicts"]}
    pooled = measured(run_dir, cfg, units, pool=True, read=(m["records"], m["p_records"]))["sweep"]
    tried = plan.get("timed_in_sample") or {}
    return {"sweep_pooled": pooled, "timed_pooled_verdicts": verdicts(
        pooled, out["noise"], plan.get("params", {}).get("min_gain", verdict.MIN_GAIN),
        tried={ALL: max(tried.values())} if tried else None)}


def pool_sizes(plan: dict) -> dict[str, int]:
    """The most prompts each category can reach (what --until-confident draws from): recorded in the plan, or for
    an older run its prompt files read again."""
    if "pool_sizes" in plan:
        return plan["pool_sizes"]
    sizes: dict[str, int] = {}
    for p in prompt_pool(Params.from_dict(plan["params"]), plan.get("categories")):
        sizes[p.category] = sizes.get(p.category, 0) + 1
    return sizes


def replay_frames(run_dir: Path, plan: dict, sweep: pl.DataFrame, gens: pl.DataFrame, p_gens: pl.DataFrame,
                  cfg: pl.DataFrame, own_costs: dict[str, dict], noise: pl.DataFrame | None = None
                  ) -> dict[str, pl.DataFrame]:
    """"replay": predicted figures of every proposer and gamma, beside the timed rows of the same configuration
    where the sweep ran them; "replay_costs": the decode costs the predictions used. Empty without a replay.
    own_costs: each timed configuration's decode costs, measured in its worker (calibrate.unit_costs). noise: per
    configuration, whether it ran busy (noise_frame): a busy baseline levels nothing (replay_levels)."""
    from harness.analysis.predict import plain_decode_ms, predictions
    d = run_dir / REPLAY_DIR
    units = ok_units(d) if d.is_dir() else set()
    if not units:
        return {}
    records = load_records(d, units)
    bases = cfg.filter(pl.col("draft") == "none")["config"].to_list()
    levels = replay_levels(bases, noise, noise_records(run_dir))
    clean = [b for b in bases if levels[b] == LEVEL_BASELINE]
    plain = plain_decode_ms(gens.filter(pl.col("config").is_in(clean)))  # ms per decode of the clean baselines
    rows = predictions(records, plain, plan.get("params", {}).get("replay_gamma", 8), pooled=True)
    if not rows:
        return {}
    from harness.calibrate import moved
    costs = pl.DataFrame([{k: r[k] for k in ("config", "policy", "proposer", "contexts", "target_ms_by_context",
                                             "draft_ms_by_context", "overhead_ms")} | {"moved": moved(r)}
                          for r in records if r.get("type") == "costs"], infer_schema_length=None)
    pred = pl.DataFrame(rows, infer_schema_length=None).rename({"config": "base"}).with_columns(
        pl.col("base").replace_strict(levels, default=LEVEL_BASELINE).alias("levelled"))
    base_of = base_configs(cfg)
    timed = sweep.filter(pl.col("draft") != "none").with_columns(
        pl.col("config").replace_strict(base_of, default=None).alias("base")).select(
        "base", "category", pl.col("draft_label").alias("proposer"), "gamma", "adaptive",
        *[pl.col(c).alias(f"timed_{c}") for c in ("config", "speedup", "speedup_lo", "speedup_hi",
                                                  "acceptance_rate", "mean_accepted_len", "prompts")])
    pred = pred.join(timed, on=["base", "category", "proposer", "gamma", "adaptive"], how="left").join(
        cfg.select(pl.col("config").alias("base"), "target", "ngl", "threads", "setup"), on="base", how="left")
    pooled, pred = pred.filter(pl.col("category") == ALL), pred.filter(pl.col("category") != ALL)
    out = {"replay": pred, "replay_costs": costs.join(cfg.select("config", "target"), on="config", how="left"),
           "replay_pooled": pooled}
    # the replay again on the very prompts the timed runs used: what their measurements check, like for like
    same = replay_same(records, gens, p_gens, base_of, dict(zip(cfg["config"], cfg["draft"])), plain,
                       plan.get("params", {}).get("replay_gamma", 8), own_costs)
    if same is not None:
        keys = ["base", "timed_config", "category", "proposer", "gamma", "adaptive"]
        out["replay_same"] = same.join(timed, on=keys, how="inner").join(
            cfg.select(pl.col("config").alias("base"), "target"), on="base", how="left")
    from harness.report.replayed import predicted_verdicts
    min_gain = plan.get("params", {}).get("min_gain", verdict.MIN_GAIN)
    return out | {"replay_verdicts": predicted_verdicts(pred, min_gain),
                  "pooled_verdicts": predicted_verdicts(pooled, min_gain) if len(pooled) else pl.DataFrame()}


def replay_same(records: list[dict], gens: pl.DataFrame, p_gens: pl.DataFrame, base_of: dict[str, str],
                draft_of: dict[str, str], plain: dict, gamma_max: int,
                own_costs: dict[str, dict] | None = None) -> pl.DataFrame | None:
    """The replay's predictions on the prompts each timed configuration ran, one configuration at a time: plain
    decoding priced at the pace of that configuration's own plain twins (paired, alternating with its
    generations: the machine's pace at that moment), else at the baselines' ("speedup_at_baseline": the
    baselines' pace, as the verdicts price it). The replay prices speculative steps against a plain speed it
    takes as measured; a machine whose speed drifts between the baselines and the timed runs, minutes apart,
    would otherwise count as the replay's error. "speedup_own_costs": the same steps priced with the timed
    configuration's own decode costs (own_costs, measured in its worker, minutes after the replay's): what it
    changes is the machine's drift between the two moments; what it leaves, the cost model's error (and, sampled,
    the draw's)."""
    from harness.analysis.predict import plain_decode_ms, predictions
    from harness.costmodel import with_unit_costs
    is_spec = pl.col("mode") == "speculative"
    out = []
    for (config, cat), g in gens.filter(is_spec).group_by("config", "category", maintain_order=True):
        base, ids, draft = base_of.get(config), set(g["prompt_id"]), draft_of.get(config)
        # its baseline's replay of its prompts, for its own proposer (the predictions cover every gamma)
        recs = [r for r in records if r.get("config") == base and r.get("proposer", draft) == draft
                and (r.get("type") == "costs" or r.get("prompt_id") in ids)]
        twins = p_gens.filter((pl.col("config") == config) & pl.col("prompt_id").is_in(list(ids))) \
            if len(p_gens) else p_gens
        own = {(base, c): ms for (_, c), ms in plain_decode_ms(twins).items()}
        rows = {}
        for key, level in (("speedup_at_baseline", plain), ("speedup", own or plain)):
            for r in predictions(recs, level, gamma_max):
                if r["category"] == cat:
                    k = (r["proposer"], r["gamma"], r["adaptive"], r["policy"])
                    rows[k] = rows.get(k, {"base": base, "config_timed": config, "at_twins": bool(own)} | r) | \
                        {key: r["speedup"], f"{key}_lo": r["speedup_lo"], f"{key}_hi": r["speedup_hi"]}
        unit = (own_costs or {}).get(config, {})
        if "target_ms_by_context" in unit:  # not a batched unit's, nor one from before workers kept repetitions
            swapped = [with_unit_costs(r, unit) if r.get("type") == "costs" else r for r in recs]
            for r in predictions(swapped, own or plain, len(unit["target_ms_by_context"][0]) - 1):
                k = (r["proposer"], r["gamma"], r["adaptive"], r["policy"])
                if r["category"] == cat and k in rows:
                    rows[k]["speedup_own_costs"] = r["speedup"]
        out += rows.values()
    if not out:
        return None
    keep = ["base", "config_timed", "policy", "category", "proposer", "gamma", "adaptive", "acceptance_rate",
            "speedup", "speedup_lo", "speedup_hi", "speedup_at_baseline", "at_twins", "speedup_own_costs"]
    return pl.DataFrame([{"speedup_own_costs": None} | r for r in out], infer_schema_length=None).select(keep).rename(
        {"config_timed": "timed_config"})


def row_intervals(steps: pl.DataFrame, gens: pl.DataFrame, p_steps: pl.DataFrame, p_gens: pl.DataFrame,
                  cfg: pl.DataFrame, pace: float = 0.0) -> pl.DataFrame:
    """Intervals per speculative (config, category): each generation against its plain twin, the paired one in
    a paired run, else the same prompt's generation by the category's plain baseline configuration; a row of one
    prompt widened by the pace's spread between twins (evidence.intervals_frame)."""
    is_spec = pl.col("mode") == "speculative"
    spec = generation_steps(steps.filter(is_spec), gens.filter(is_spec), spec=True) if len(steps) else {}
    if len(p_gens):
        twins = generation_steps(p_steps, p_gens, spec=False)
    else:
        base_of = base_configs(cfg)
        by_base = generation_steps(steps.filter(~is_spec), gens.filter(~is_spec), spec=False) if len(steps) else {}
        twins = {k: by_base[b] for k in spec if (b := (base_of.get(k[0]), *k[1:])) in by_base}
    return intervals_frame(row_evidence(spec, twins), pace)


def base_configs(cfg: pl.DataFrame) -> dict[str, str]:
    """Speculative configuration -> the plain baseline configuration of its target, policy, offload, threads and
    context settings."""
    base = {tuple(r[k] for k in BASE_KEYS[:-1]): r["config"] for r in cfg.filter(pl.col("draft") == "none")
            .iter_rows(named=True)}
    return {r["config"]: base.get(tuple(r[k] for k in BASE_KEYS[:-1])) for r in cfg.iter_rows(named=True)}


def closing_baselines(run_dir: Path, cfg: pl.DataFrame) -> pl.DataFrame | None:
    """Plain tokens/s per baseline key from the baselines bench ran again after the sweep; None without them."""
    d = run_dir / DRIFT_DIR
    _, gens = metrics.frames(load_records(d, ok_units(d))) if d.is_dir() else (None, pl.DataFrame())
    if not len(gens):
        return None
    tp = metrics.throughput(gens, ["config", "category"])
    tp = tp.join(cfg.select("config", *BASE_KEYS[:-1]), on="config")
    return tp.select(*BASE_KEYS, pl.col("tokens_per_s").alias("base_end_tokens_per_s"))


def equivalence(gens: pl.DataFrame, divergences: pl.DataFrame, cfg: pl.DataFrame) -> pl.DataFrame:
    """Greedy speculative outputs against the greedy baseline of the same target, offload and prompt; each
    divergence classified by the kernel check its worker recorded (harness.divergence)."""
    g = gens.join(cfg.select("config", "target", "draft", "gamma", "policy", "ngl", "threads", "setup"), on="config")
    g = g.filter(pl.col("policy") == "greedy")
    base = g.filter(pl.col("draft") == "none")
    if not len(base):
        return pl.DataFrame()
    bkey = ["target", "ngl", "threads", "setup", "prompt_id", "repeat"]
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
