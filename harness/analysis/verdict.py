"""Break-even and the rule: speculate only when accepted progress per millisecond beats plain decoding, by a gain
worth having."""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from harness.analysis.intervals import LEVEL, interval, t_quantile

# The least gain worth having (--min-gain): below it, drift between the plain and speculative twins and the cost
# model's error are of the same size as the gain (docs/methodology.md#verdicts).
MIN_GAIN = 0.05
POWER = 0.8     # "to settle": the further prompts that settle the likeliest verdict with this probability
CAP = 5000      # beyond this many further prompts a verdict is out of reach


def break_even_rate(step_ms: float, base_ms_per_token: float, gamma: float) -> float | None:
    """The acceptance rate (accepted / proposed) at which a speculative step of step_ms, emitting
    1 + rate * gamma tokens, matches plain decoding at base_ms_per_token. None: even 100% loses."""
    if gamma <= 0 or base_ms_per_token <= 0:
        return None
    rate = (step_ms / base_ms_per_token - 1) / gamma
    return max(rate, 0.0) if rate <= 1 else None


def where_time_goes(draft_ms: float, verify_ms: float, overhead_ms: float) -> str:
    total = draft_ms + verify_ms + overhead_ms
    if total <= 0:
        return ""
    return (f"draft {draft_ms / total:.0%}, verify {verify_ms / total:.0%}, "
            f"overhead {overhead_ms / total:.0%} of step time")


SPECULATE, PLAIN, NO_GAIN, INCONCLUSIVE, BUSY, BEYOND, NO_DATA = (
    "speculate", "plain decoding", "no gain worth having", "inconclusive", "unreliable (busy machine)",
    "unreliable (beyond its costs)", "no data")
SETTLED = (SPECULATE, PLAIN, NO_GAIN)


@dataclass(frozen=True)
class Evidence:
    """One configuration's speedup over plain decoding in a group (a category and policy on one target)."""
    config: str
    speedup: float
    se: float | None   # bootstrap standard error of log(speedup)
    prompts: int
    busy: bool = False


@dataclass(frozen=True)
class Verdict:
    kind: str
    chosen: Evidence | None = None   # the configuration the verdict names (the best one unless it says speculate)
    lo: float | None = None          # the interval the verdict rests on, for the chosen configuration
    hi: float | None = None
    adjusted: bool = False           # widened for having picked the best of k configurations
    k: int = 0
    further: int | None = None       # inconclusive: further prompts that settle it with probability POWER
    why: str = ""
    min_gain: float = MIN_GAIN
    level: float = LEVEL
    at_most: float | None = None     # no gain worth having: the group's largest one-sided upper bound


def upper_bound(x: float, se: float, n: int, level: float = LEVEL) -> float:
    """One-sided `level` upper bound of a speedup x (log-scale se from n prompts): TOST's bound."""
    return interval(x, se, n, 2 * level - 1, log=True)[1]


def decide(group: list[Evidence], level: float = LEVEL, min_gain: float = MIN_GAIN, tried: int = 0) -> Verdict:
    """Speculate only when accepted progress per millisecond beats plain decoding by a gain worth having.

    speculate: some configuration's interval lies above 1 + min_gain, widened (Bonferroni) for having picked it
    from the group's k (or from `tried`, when the configurations were themselves chosen among that many), so that
    trying many configurations does not manufacture a winner; the best such one is named. plain decoding: every
    configuration's interval lies below 1. no gain worth having: every configuration's one-sided upper bound lies
    below 1 + min_gain (a claim about all of them: no widening). inconclusive: none of these. Only configurations
    measured on 2 prompts or more take part: one prompt says nothing of how prompts differ. A group measured while
    the machine was busy is unreliable, whatever its intervals say."""
    rows = [r for r in group if r.speedup and r.se is not None]
    if not rows:
        return Verdict(NO_DATA, min_gain=min_gain, level=level)
    best = max(rows, key=lambda r: r.speedup)
    common = {"min_gain": min_gain, "level": level}
    if any(r.busy for r in group):
        return Verdict(BUSY, best, *interval(best.speedup, best.se, best.prompts, level, log=True), k=len(rows),
                       why="other processes used the CPU while it ran (see Machine noise in the diagnostics)", **common)
    usable = [r for r in rows if r.prompts >= 2]
    left_out = len(rows) - len(usable)
    if not usable:
        lo, hi = interval(best.speedup, best.se, best.prompts, level, log=True)
        return Verdict(INCONCLUSIVE, best, lo, hi, k=len(rows), further=further_prompts(rows, level, min_gain),
                       why="one prompt per configuration: how prompts differ is unmeasured", **common)
    why = f"{left_out} configuration(s) with one prompt left out" if left_out else ""
    k = max(len(usable), tried)
    wide = 1 - (1 - level) / k
    bar = 1 + min_gain
    winners = [r for r in usable if interval(r.speedup, r.se, r.prompts, wide, log=True)[0] > bar]
    if winners:
        w = max(winners, key=lambda r: r.speedup)
        return Verdict(SPECULATE, w, *interval(w.speedup, w.se, w.prompts, wide, log=True), adjusted=k > 1, k=k,
                       why=why, **common)
    best = max(usable, key=lambda r: r.speedup)
    lo, hi = interval(best.speedup, best.se, best.prompts, level, log=True)
    if all(interval(r.speedup, r.se, r.prompts, level, log=True)[1] < 1 for r in usable):
        return Verdict(PLAIN, best, lo, hi, k=k, why=why, **common)
    most = max(upper_bound(r.speedup, r.se, r.prompts, level) for r in usable)
    if most < bar:
        return Verdict(NO_GAIN, best, lo, hi, k=k, why=why, at_most=most, **common)
    return Verdict(INCONCLUSIVE, best, lo, hi, k=k, further=further_prompts(usable, level, min_gain, tried),
                   why=why, **common)


def further_prompts(rows: list[Evidence], level: float = LEVEL, min_gain: float = MIN_GAIN, tried: int = 0,
                    power: float = POWER) -> int | None:
    """Further prompts (each configuration getting as many) for the group's likeliest verdict to settle with
    probability `power`, if each configuration's true speedup is what was measured and its spread per prompt stays
    as measured: speculate when the best lies above 1 + min_gain, else no gain worth having (which plain decoding
    implies). Finite at 1.00x; None within CAP only where the best sits at the bar itself."""
    bar = math.log(1 + min_gain)
    best = max(rows, key=lambda r: r.speedup)
    if math.log(best.speedup) > bar:
        wide = 1 - (1 - level) / max(len(rows), tried)
        def prob(extra: int) -> float:
            return _p_clears(best, extra, 1 - (1 - wide) / 2, math.log(best.speedup) - bar)
    else:
        def prob(extra: int) -> float:
            return math.prod(_p_clears(r, extra, level, bar - math.log(r.speedup)) for r in rows)
    first = 2 if min(r.prompts for r in rows) < 2 else 1  # from one prompt, at least three
    if prob(CAP) < power:
        return None
    lo, hi = first, CAP  # the probability grows with the prompts: bisect for the least that reaches it
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if prob(mid) >= power else (mid + 1, hi)
    return lo


def _p_clears(r: Evidence, extra: int, one_sided: float, margin: float) -> float:
    """P(the one-sided `one_sided` bound of r clears a bar `margin` away on the log scale) with extra prompts."""
    m = r.prompts + extra
    s = r.se * math.sqrt(r.prompts / m)
    if s <= 0:
        return 1.0 if margin > 0 else 0.0
    return NormalDist().cdf(margin / s - _t(one_sided, m - 1))


def _t(p: float, df: int) -> float:
    """Student's t quantile; past 200 degrees of freedom its first-order expansion about the normal."""
    if df <= 200:
        return t_quantile(p, df)
    z = NormalDist().inv_cdf(p)
    return z + (z ** 3 + z) / (4 * df)
