"""A new run as bench plans it before anything runs: what its first pass runs, its estimate by part (the
evidence split into its prompts' evaluation and its generation), its fit to the budget (bench.budget), and the
lines that say so: the plan's shape, what it covers, the estimate. A dry run prints them and stops."""
from __future__ import annotations

from collections import Counter

import click

from harness.bench.budget import Fit, Shape, fit
from harness.bench.estimate import evidence_parts, remaining_parts
from harness.bench.probe import Figures
from harness.instance import Instance
from harness.plan import Params, expand, first_round, prompt_pool


def first_pass(instances: list[Instance], skipped: dict, params: Params) -> list[Instance]:
    """What a new run runs before its replay: every configuration, or with a timed subset the baselines alone."""
    return [i for i in instances if i.id not in skipped and (i.baseline or not params.timed_subset)]


def fit_new_run(params: Params, skipped: dict, figures: Figures) -> Fit:
    """A new run's parameters cut to fit its budget (bench.budget), estimated as a resumed run's remainder is."""
    pool = prompt_pool(params)
    shape = Shape(max(Counter(p.category for p in pool).values()), max(p.max_tokens for p in pool),
                  max(p.chars for p in pool))
    return fit(params, lambda p: sum(new_run_parts(p, skipped, figures).values()), shape)


def _first_units(p: Params, skipped: dict) -> tuple[list, list[Instance], list]:
    prompts = first_round(p)
    instances = expand(p)
    return [(i, 0, prompts) for i in first_pass(instances, skipped, p)], instances, prompts


def new_run_parts(p: Params, skipped: dict, figures: Figures) -> dict[str, float]:
    """A new run's estimate by part (estimate.remaining_parts)."""
    todo, instances, prompts = _first_units(p, skipped)
    return remaining_parts(todo, instances, skipped, prompts, p, None, {}, figures)


def budget_record(fitted: Fit, skipped: dict, figures: Figures) -> dict:
    """plan.json's `budget`: the fit (Fit.record), the estimate by part (`parts_s`, beside `took_s` once it ran),
    and its evidence split (`evidence_s`: prompt evaluation, generation), which the report sets against the
    whole."""
    p = fitted.params
    parts = new_run_parts(p, skipped, figures)
    split = evidence_parts(_first_units(p, skipped)[0], p, None, figures)
    return fitted.record() | {"parts_s": {k: round(s, 1) for k, s in parts.items()},
                              "evidence_s": {k: round(s, 1) for k, s in split.items()}}


def plan_line(instances: list[Instance], skipped: dict, prompts: list, params: Params, units: int,
              new: bool = True) -> str:
    """The run's shape; for a new run, with what follows its first units."""
    from harness.bench.replay import proposers
    line = (f"{len(instances)} configurations x {len(prompts)} prompts x {params.repeat} repeat(s); "
            f"{units} unit(s) to run")
    if params.replay and new:
        bases = sum(1 for i in instances if i.baseline and i.id not in skipped)
        names = ", ".join(map(str, proposers(instances, params)))
        line += (f", then the replay of {bases} baseline(s) through {names} up "
                 f"to gamma {params.replay_gamma}")
    if params.timed_subset and new:
        what = "each answer's configuration" if params.timed_scope == "answers" else \
            "each proposer's predicted best gamma and gamma 1"
        line += f", then a timed subset ({what}) on each category's first {params.timed_subset} prompt(s)"
    return line


def covers_line(instances: list[Instance], prompts: list, params: Params) -> str:
    """What the run's evidence covers, in one line: targets, proposers, gammas, policies, prompts, tokens, and
    the checks after it."""
    def names(xs) -> str:
        return ", ".join(dict.fromkeys(map(str, xs))) or "none"
    cats = Counter(p.category for p in prompts)
    each = f"{min(cats.values())}-{max(cats.values())}" if len(set(cats.values())) > 1 else f"{max(cats.values())}"
    gammas = sorted({i.gamma for i in instances if not i.baseline and not i.draft.own_gamma})
    tokens = f"{params.max_tokens} tokens" if params.max_tokens else "each prompt's own max tokens"
    line = (f"covers: target {names(i.target for i in instances)}; drafts "
            f"{names(i.draft for i in instances if not i.baseline)}; gammas {names(gammas)}"
            f"{f' (replayed up to {params.replay_gamma})' if params.replay else ''}; policies "
            f"{names(i.policy.label for i in instances if i.baseline)}; {each} prompt(s) in each of {len(cats)} "
            f"categories ({len(prompts)}), {tokens} each")
    if params.timed_subset:
        line += f"; timed: {params.timed_scope} on {params.timed_subset} prompt(s) a category"
    if params.server_check:
        line += f"; llama-server check: {params.server_check} prompt(s) an answer"
    return line


def estimate_line(est_s: float, params: Params, source: str) -> str:
    return (f"estimated time: about {est_s / 60:.1f} min (from {source}"
            + ("; more if --until-confident adds prompts" if params.until_confident else "") + ")")


def dry_run(instances: list[Instance], skipped: dict, prompts: list, params: Params, fitted: Fit,
            figures: Figures) -> None:
    click.echo(plan_line(instances, skipped, prompts, params, len(first_pass(instances, skipped, params))),
               err=True)
    click.echo(covers_line(instances, prompts, params), err=True)
    rec = budget_record(fitted, skipped, figures)
    parts = ", ".join(f"{k} {s / 60:.1f} min" for k, s in rec["parts_s"].items() if s)
    split = " and ".join(f"{k} {s / 60:.1f} min" for k, s in rec["evidence_s"].items())
    click.echo(f"{estimate_line(fitted.estimate_after_s, params, figures.source())}: {parts} (the evidence: {split})",
               err=True)
    click.echo(f"dry run: each model's probe for the estimate ({figures.describe()}); nothing else ran, and no run "
               "directory was made", err=True)
