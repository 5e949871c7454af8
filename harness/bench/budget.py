"""Fitting a new run into its time budget (`--budget-min`) before anything runs. While the estimate exceeds the
budget, cut, in this order: the tokens per generation (not below 16), the gammas replayed or swept (not below
4), the timed subset (not below one prompt per category), the prompts per category (not below 10; a category
with fewer keeps all). Each is halved at a time until the run fits or it reaches its floor, so a run is cut no
more than it must be, to values that recur from one machine to the next. Prompts go last of these: the verdicts
rest on them. Where even those floors do not fit, the main sweep keeps its coolest policy only (greedy) and the
cuts are planned again, so that the further sweeps (`also`: the default's F16 target, the one configuration that
speculates on a CPU) stay; where that does not fit either, they are dropped whole and the cuts planned again
without them, with every policy: on an Intel Xeon VM at 11 tok/s, the default profile's F16 sweep alone cost
more than half the floors' 21 minutes. What still does not fit runs anyway, and says so. The run is fitted to PLANNED
of the budget, not all of it: the estimate has come out up to 18% low (on Intel Xeon VMs, 17.6 min estimated
against 20.8 taken, and 16.8 against 20.5 before the probe timed each block size; 16.3 against 17.3 after).

Pure: the caller passes the cost estimate (seconds for a parameter set) and the prompt set's shape."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from harness.plan import Params

MIN_TOKENS, MIN_GAMMA, MIN_PROMPTS = 16, 4, 10
PLANNED = 0.85  # the share of the budget a run is fitted to: room for the estimate's error


@dataclass(frozen=True)
class Cut:
    param: str  # the Params field cut
    before: int | list
    after: int | list
    estimate_before_s: float
    estimate_after_s: float
    why: str
    hint: str = ""  # what the line adds: how to keep what was dropped


@dataclass(frozen=True)
class Fit:
    params: Params
    budget_min: float | None
    estimate_before_s: float
    estimate_after_s: float
    cuts: tuple[Cut, ...] = ()

    def record(self) -> dict:
        """What plan.json keeps of the fit (`budget`): what report.sections.budget_line says."""
        return {"budget_min": self.budget_min, "estimate_before_s": round(self.estimate_before_s, 1),
                "estimate_after_s": round(self.estimate_after_s, 1),
                "fits": self.budget_min is None or self.estimate_after_s <= self.budget_min * 60 * PLANNED,
                "planned": PLANNED,
                "cuts": [asdict(c) | {"estimate_before_s": round(c.estimate_before_s, 1),
                                      "estimate_after_s": round(c.estimate_after_s, 1)} for c in self.cuts]}


def _steps(largest_category: int, own_max_tokens: int) -> list[tuple[str, Callable[[Params], Params | None]]]:
    """(field, one halving of it), in the order they are cut; a halving is None at its floor."""
    def tokens(p: Params) -> Params | None:
        now = p.max_tokens or own_max_tokens  # 0: each prompt's own, at most own_max_tokens
        return replace(p, max_tokens=max(MIN_TOKENS, now // 2)) if now > MIN_TOKENS else None

    def gammas(p: Params) -> Params | None:
        # a replay predicts every gamma up to replay_gamma, and only those can be timed: the sweep follows it
        top = p.replay_gamma if p.replay else max((g.n for g in p.gamma if not g.adaptive), default=0)
        if top <= MIN_GAMMA:
            return None
        new = max(MIN_GAMMA, top // 2)
        kept = [g for g in p.gamma if g.adaptive or g.n <= new]  # auto:N keeps its own N
        return replace(p, gamma=kept, replay_gamma=new if p.replay else p.replay_gamma) if kept else None

    def subset(p: Params) -> Params | None:
        return replace(p, timed_subset=max(1, p.timed_subset // 2)) if p.replay and p.timed_subset > 1 else None

    def prompts(p: Params) -> Params | None:
        now = p.per_category or largest_category
        return replace(p, per_category=max(MIN_PROMPTS, now // 2)) if now > MIN_PROMPTS else None

    return [("max_tokens", tokens), ("gamma", gammas), ("timed_subset", subset), ("per_category", prompts)]


def fit(params: Params, cost: Callable[[Params], float], largest_category: int, own_max_tokens: int) -> Fit:
    """params cut to fit params.budget_min by cost(params) (seconds), and the cuts made, each with its reason.
    largest_category: the most prompts a category has; own_max_tokens: the longest of the prompts' own
    max_tokens (what max_tokens 0 stands for)."""
    first = _halved(params, cost, largest_category, own_max_tokens)
    if not params.also or first.estimate_after_s <= (params.budget_min or 0) * 60 * PLANNED:
        return first
    keep = first.estimate_after_s / PLANNED / 60  # the budget at which the floors would have fitted with them
    coolest = min(params.temp)
    if len(params.temp) > 1:  # the further sweeps decide the answer more often (F16, where a CPU speculates)
        one = _halved(replace(params, temp=[coolest]), cost, largest_category, own_max_tokens)
        if one.estimate_after_s <= params.budget_min * 60 * PLANNED:
            drop = Cut("temp", params.temp, [coolest], first.estimate_before_s, one.estimate_before_s,
                       f"the further sweeps kept: cut to their floors with every policy, estimated "
                       f"{first.estimate_after_s / 60:.1f} min, over {params.budget_min * PLANNED:.1f} min",
                       f"--budget-min {math.ceil(keep)} keeps them")
            return replace(one, estimate_before_s=first.estimate_before_s, cuts=(drop, *one.cuts))
    alone = replace(params, also=[])
    rest = _halved(alone, cost, largest_category, own_max_tokens)
    drop = Cut("also", [_sweep(a) for a in params.also], [], first.estimate_before_s, rest.estimate_before_s,
               f"cut to their floors, estimated {first.estimate_after_s / 60:.1f} min, over "
               f"{params.budget_min * PLANNED:.1f} min ({PLANNED:.0%} of the {params.budget_min:g} min budget)",
               f"--budget-min {math.ceil(keep)} keeps them")
    return replace(rest, estimate_before_s=first.estimate_before_s, cuts=(drop, *rest.cuts))


def _sweep(extra: dict) -> str:
    """A further sweep in a few words: its lists."""
    return " ".join(f"{k} {','.join(map(str, v if isinstance(v, list) else [v]))}" for k, v in extra.items())


def _halved(params: Params, cost: Callable[[Params], float], largest_category: int, own_max_tokens: int) -> Fit:
    """fit's halvings, each down to its floor."""
    est = before = cost(params)
    if params.budget_min is None:
        return Fit(params, None, before, before)
    budget_s, p, cuts = params.budget_min * 60 * PLANNED, params, []
    for name, halve in _steps(largest_category, own_max_tokens):
        start, start_est = p, est
        while est > budget_s and (nxt := halve(p)) is not None:
            p, est = nxt, cost(nxt)
        if p is not start:
            field = "replay_gamma" if name == "gamma" and p.replay else name
            was = getattr(start, field) or (largest_category if field == "per_category" else own_max_tokens)
            now = getattr(p, field)
            if field == "gamma":  # as plan.json's params hold them
                was, now = [g.json() for g in was], [g.json() for g in now]
            cuts.append(Cut(field, was, now, start_est, est,
                            f"estimated {start_est / 60:.1f} min, over {budget_s / 60:.1f} min ({PLANNED:.0%} of the "
                            f"{params.budget_min:g} min budget)"))
    return Fit(p, params.budget_min, before, est, tuple(cuts))
