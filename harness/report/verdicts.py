"""The answer per category: the verdict of each (target, offload, threads, policy, category) group from its rows'
intervals, and the machine noise those rows were measured under."""
from __future__ import annotations

import polars as pl

from harness.analysis.noise import unit_summary
from harness.analysis.intervals import LEVEL
from harness.analysis.verdict import MIN_GAIN, Evidence, decide

GROUP = ["target", "policy", "ngl", "threads", "setup", "category"]
# what a verdict line carries of the configuration it names
CHOSEN = ("config", "draft", "draft_label", "gamma_label", "speedup", "prompts", "tokens_per_s", "acceptance_rate",
          "proposed", "adaptive", "draft_ms", "verify_ms", "overhead_ms", "verify_ms_per_call", "ref_tokens_per_ms",
          "break_even_rate")


def noise_frame(units: dict[str, dict], p_gens: pl.DataFrame, cfg: pl.DataFrame) -> pl.DataFrame:
    """Per configuration: foreign load while its units ran (mean, worst second, load average), busy or not, and,
    in a paired run, how fast its plain twins ran against the same prompts' plain twins across the whole run
    (median ratio and range): a configuration measured in a slow or fast spell shows here."""
    rows: dict[str, dict] = {}
    for r in units.values():
        c = r.get("config")
        if c is None:
            continue
        x = rows.setdefault(c, {"config": c, "foreign_mean": 0.0, "foreign_max": 0.0, "load1": None, "busy": False,
                                "seconds": 0.0})
        u = unit_summary(r)
        n = len(r["shares"]) if "shares" in r else r.get("samples") or 0
        x["foreign_mean"] = (x["foreign_mean"] * x["seconds"] + u["foreign_mean"] * n) / max(x["seconds"] + n, 1)
        x["seconds"] += n
        x["foreign_max"] = max(x["foreign_max"], u["foreign_max"])
        x["load1"] = max(x["load1"] or 0.0, r.get("load1") or 0.0)
        x["busy"] = x["busy"] or u["busy"]
    schema = {"config": pl.String, "foreign_mean": pl.Float64, "foreign_max": pl.Float64, "load1": pl.Float64,
              "busy": pl.Boolean, "seconds": pl.Float64}
    frame = cfg.select("config").join(pl.DataFrame(list(rows.values()), schema=schema), on="config", how="left")
    if len(p_gens):
        g = p_gens.join(cfg.select("config", "policy"), on="config").with_columns(
            (pl.col("tokens_per_s") / pl.col("tokens_per_s").median().over("prompt_id", "repeat", "policy"))
            .alias("ratio"))
        spread = g.group_by("config").agg(pl.col("ratio").median().alias("plain_vs_run"),
                                          pl.col("ratio").min().alias("plain_vs_run_min"),
                                          pl.col("ratio").max().alias("plain_vs_run_max"))
        frame = frame.join(spread, on="config", how="left")
    return frame


LEVEL_BASELINE, LEVEL_REPLAY, LEVEL_BUSY = "plain baseline", "replay costs", "busy"


def replay_levels(bases: list[str], noise: pl.DataFrame | None, records: dict[str, dict]) -> dict[str, str]:
    """Per plain baseline, what its replay's predictions are levelled to: its measured plain pace; the replay's
    own measured decode, where the baseline ran busy (a pace slowed by others would pass for a cheap speculative
    step); or nothing, where the replay itself ran busy (its costs are then not this machine's)."""
    busy = set() if noise is None or not len(noise) else \
        {r["config"] for r in noise.iter_rows(named=True) if r["busy"]}
    out = {}
    for b in bases:
        rec = records.get(f"replay/{b}")
        out[b] = LEVEL_BUSY if rec is not None and unit_summary(rec)["busy"] else \
            LEVEL_REPLAY if b in busy else LEVEL_BASELINE
    return out


def speculated(g: pl.DataFrame, proposed: str) -> pl.DataFrame:
    """The configurations of a group that proposed anything: one that never did (an adaptive controller that
    judged speculation not worth a probe) decoded plainly, and is evidence neither way; all of them if none did."""
    some = g.filter(pl.col(proposed).fill_null(0) > 0)
    return some if len(some) else g


def verdicts(sweep: pl.DataFrame, noise: pl.DataFrame, min_gain: float = MIN_GAIN, level_of=None,
             tried: dict[str, int] | None = None) -> pl.DataFrame:
    """One line per group: its verdict and the configuration and interval it names. level_of(group, n): the level
    of a group whose configurations have n prompts (an --until-confident look's; 95% by default; None: the group
    is not looked at). tried: per
    category, the configurations its timed ones were chosen among on their own prompts (the verdict is widened
    for that choice)."""
    busy = {r["config"] for r in noise.iter_rows(named=True) if r["busy"]}
    rows = []
    for key, g in sweep.group_by(GROUP, maintain_order=True):
        spec = speculated(g.filter(pl.col("draft") != "none"), "proposed")
        base = g.filter(pl.col("draft") == "none")
        if not len(spec):
            continue
        group = dict(zip(GROUP, key))
        base_busy = any(c in busy for c in base["config"])
        ev = [Evidence(r["config"], r["speedup"], r["speedup_se"], r["prompts"] or 0, r["config"] in busy or base_busy)
              for r in spec.iter_rows(named=True)]
        n = max(e.prompts for e in ev)
        level = LEVEL if level_of is None else level_of(group, n)
        if level is None:  # not looked at again
            continue
        v = decide(ev, level, min_gain, (tried or {}).get(group["category"], 0))
        chosen = spec.filter(pl.col("config") == v.chosen.config).row(0, named=True) if v.chosen else {}
        rows.append(group | {
            "verdict": v.kind, "lo": v.lo, "hi": v.hi, "adjusted": v.adjusted, "k": v.k, "further": v.further,
            "why": v.why, "min_gain": v.min_gain, "level": v.level, "at_most": v.at_most, "group_prompts": n,
            "plain_tokens_per_s": chosen.get("ref_tokens_per_s")}
            | {k: chosen.get(k) for k in CHOSEN})
    return verdicts_frame(rows)


def verdicts_frame(rows: list[dict]) -> pl.DataFrame:
    """Verdict lines in report order: per target and setting, greedy first, categories in their file order."""
    if not rows:
        return pl.DataFrame()
    from harness.prompts import CATEGORIES
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return pl.DataFrame(rows, infer_schema_length=None).with_columns(
        (pl.col("policy") != "greedy").alias("_sampled"),
        pl.col("category").replace_strict(order, default=len(order), return_dtype=pl.Int64).alias("_cat")).sort(
        ["target", "ngl", "threads", "setup", "_sampled", "policy", "_cat", "category"]).drop("_sampled", "_cat")
