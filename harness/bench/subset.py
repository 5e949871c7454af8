"""The timed subset (`--timed-subset N`): with a replay, only some configurations are timed, chosen from its
predictions, on the category's first N prompts, paired with plain decoding as ever. With `--timed-scope proposers`
(the default), per category and policy, each proposer's predicted best gamma and gamma 1 (of llama.cpp's n-gram
types, one gamma each, the best predicted alone), and each predicted "speculate" answer's configuration; the gamma
is chosen on the category's other prompts, so that the timed runs check it out of sample. With `answers`, each
answer's configuration alone, what its timed check reads: a unit or two per policy instead of two per proposer,
which the budget narrows to first (bench.budget). They check the predictions; the predictions carry the
verdicts."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from harness.bench.noise import busy_units
from harness.instance import Instance
from harness.specs import LlamaNgram, parse_draft


def first_prompts(prompts: list, n: int) -> dict[str, list]:
    """Each category's first n prompts, in the run's order: the prompts the subset is timed on."""
    firsts: dict[str, list] = {}
    for p in prompts:
        if len(firsts.setdefault(p.category, [])) < n:
            firsts[p.category].append(p)
    return firsts


def choose(run_dir: Path, instances: list[Instance], prompts: list, n: int,
           scope: str = "proposers") -> tuple[dict[str, list[str]], dict[str, int]]:
    """({configuration id: prompt ids to time it on}, the plan's timed_in_sample), from the run's replay. Each
    proposer's gamma is chosen on the category's other prompts: chosen on the prompts it is then timed on, its
    luck there would pass for a confirmation. A category with no other prompt is chosen on its timed ones:
    timed_in_sample gives it the number of (proposer, gamma) configurations the choice was among, for its
    verdict to be widened by. scope "answers": each answer's configuration alone (plan.TIMED_SCOPES)."""
    firsts = {cat: [p.id for p in ps] for cat, ps in first_prompts(prompts, n).items()}
    pred, in_sample = held_out_predictions(run_dir, firsts)
    if pred is None:
        return {}, {}
    pred = pred.filter(~pl.col("adaptive"))
    by_key = {(i.plain().id, i.policy.label, i.draft_label, i.gamma): i.id
              for i in instances if not i.baseline and not i.adaptive}
    picks = _proposer_picks(pred) if scope == "proposers" else []
    chosen: dict[str, list[str]] = {}
    for base, policy, cat, proposer, gamma in picks:
        config = by_key.get((base, policy, proposer, gamma))
        if config is not None:
            chosen.setdefault(config, []).extend(firsts.get(cat, []))
    # and what each predicted "speculate" (with scope answers, each answer) would have its commands run, timed
    # before the answer rests on it (over all prompts, as the answer is predicted; an adaptive gamma's best fixed
    # one, as llama.cpp runs)
    for (base, policy, cat, proposer, gamma) in answered(run_dir, every=scope == "answers"):
        config = by_key.get((base, policy, proposer, gamma))
        if config is not None and not set(firsts.get(cat, [])) <= set(chosen.get(config, [])):
            chosen.setdefault(config, []).extend(firsts.get(cat, []))
    # a (proposer, gamma) per prediction row: each category's most rows of one target and policy
    tried = pred.filter(pl.col("category").is_in(list(in_sample))).group_by("config", "policy", "category").len()
    return chosen, dict(tried.group_by("category").agg(pl.col("len").max()).iter_rows())


def _proposer_picks(pred: pl.DataFrame) -> list[tuple[str, str, str, str, int]]:
    """(baseline, policy, category, proposer, gamma): each proposer's predicted best gamma and gamma 1 per group."""
    llama = pl.col("draft").is_in([d for d in pred["draft"].unique() if isinstance(parse_draft(d), LlamaNgram)])
    picks = []
    for (base, policy, cat, proposer), g in pred.filter(~llama).group_by(["config", "policy", "category", "proposer"],
                                                                         maintain_order=True):
        best = int(g.sort("speedup", descending=True)["gamma"][0])
        picks += [(base, policy, cat, proposer, gamma) for gamma in dict.fromkeys((best, 1))]
    # llama.cpp's n-gram types have one gamma each, and a sweep may size each several ways: the group's best alone
    for (base, policy, cat), g in pred.filter(llama).group_by(["config", "policy", "category"], maintain_order=True):
        r = g.sort("speedup", descending=True).row(0, named=True)
        picks.append((base, policy, cat, r["proposer"], int(r["gamma"])))
    return picks


def answered(run_dir: Path, every: bool = False) -> list[tuple[str, str, str, str, int]]:
    """(baseline, policy, category, proposer, fixed gamma) of each group the replay predicts "speculate" for
    (every: each group it answers), from all its prompts: the configuration its commands run."""
    from harness.analysis.verdict import MIN_GAIN, SPECULATE
    from harness.report.replayed import best_fixed, predicted_verdicts
    from harness.rundir import read_plan
    pred, _ = held_out_predictions(run_dir, {})
    if pred is None:
        return []
    v = predicted_verdicts(pred, read_plan(run_dir).get("params", {}).get("min_gain", MIN_GAIN),
                           group=["config", "policy", "category"])
    out = []
    for r in (v if every else v.filter(pl.col("verdict") == SPECULATE)).iter_rows(named=True):
        x = best_fixed(pred, r, "config") if r["adaptive"] else r
        if x is not None:
            out.append((r["config"], r["policy"], r["category"], r["proposer"], int(x["gamma"])))
    return out


def held_out_predictions(run_dir: Path, firsts: dict[str, list[str]]) -> tuple[pl.DataFrame | None, set[str]]:
    """The replay's predictions (analysis.predict) from each category's prompts beyond its timed ones `firsts`,
    or from all of them where it has no other (those categories: the second value). None without a replay."""
    from harness.analysis import metrics
    from harness.analysis.predict import plain_decode_ms, predictions
    from harness.rundir import REPLAY_DIR, finished, load_records, ok_units, read_plan
    d = run_dir / REPLAY_DIR
    units = ok_units(d) if d.is_dir() else set()
    records = load_records(d, units)
    timed = {x for ids in firsts.values() for x in ids}
    others = {r["category"] for r in records if r["type"] == "replay_prompt" and r["prompt_id"] not in timed}
    skip = {x for cat in others for x in firsts.get(cat, [])}
    records = [r for r in records if r.get("prompt_id") not in skip]
    # the plain speed each category's prediction is levelled to, over the same prompts; a baseline that ran busy
    # levels nothing (its replay's own decode cost stands: report.verdicts.replay_levels)
    bases = {r["config"] for r in records}
    plain_units = {u for u, r in finished(run_dir).items() if r.get("status") == "ok" and r["config"] in bases}
    plain_units -= set(busy_units(run_dir, sorted(plain_units)))
    gens = metrics.frame([r for r in load_records(run_dir, plain_units) if r.get("prompt_id") not in skip],
                         "generation")
    rows = predictions(records, plain_decode_ms(gens), read_plan(run_dir).get("params", {}).get("replay_gamma", 8))
    in_sample = {r["category"] for r in records if r["type"] == "replay_prompt"} - others
    return (pl.DataFrame(rows, infer_schema_length=None), in_sample) if rows else (None, set())
