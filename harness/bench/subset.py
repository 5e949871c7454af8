"""The timed subset (`--timed-subset N`): with a replay, only some configurations are timed, chosen from its
predictions: per category and policy, each proposer's predicted best gamma and gamma 1, on the category's first
N prompts, paired with plain decoding as ever. They check the predictions; the predictions carry the verdicts."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from harness.plan import Instance


def first_prompts(prompts: list, n: int) -> dict[str, list]:
    """Each category's first n prompts, in the run's order: the prompts the subset is timed on."""
    firsts: dict[str, list] = {}
    for p in prompts:
        if len(firsts.setdefault(p.category, [])) < n:
            firsts[p.category].append(p)
    return firsts


def choose(run_dir: Path, instances: list[Instance], prompts: list, n: int) -> dict[str, list[str]]:
    """{configuration id: prompt ids to time it on}, from the run's replay predictions."""
    from harness.report.tables import compute
    from harness.sampling import Policy
    pred = compute(run_dir).get("replay")
    if pred is None or not len(pred):
        return {}
    firsts = {cat: [p.id for p in ps] for cat, ps in first_prompts(prompts, n).items()}
    by_key = {(i.target, i.ngl, i.threads, i.setup, Policy(**i.policy).label, i.draft_label, i.gamma): i.id
              for i in instances if not i.baseline and not i.adaptive}
    chosen: dict[str, list[str]] = {}
    for (target, ngl, threads, setup, policy, cat, proposer), g in pred.filter(~pl.col("adaptive")).group_by(
            ["target", "ngl", "threads", "setup", "policy", "category", "proposer"], maintain_order=True):
        best = int(g.sort("speedup", descending=True)["gamma"][0])
        for gamma in dict.fromkeys((best, 1)):
            config = by_key.get((target, ngl, threads, setup, policy, proposer, gamma))
            if config is not None:
                chosen.setdefault(config, []).extend(firsts.get(cat, []))
    return chosen
