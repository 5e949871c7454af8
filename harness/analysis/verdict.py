"""Break-even and the rule: speculate only when accepted progress per millisecond beats plain decoding."""
from __future__ import annotations

from dataclasses import dataclass

from harness.analysis.intervals import LEVEL, interval, prompts_to_settle


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


SPECULATE, PLAIN, INCONCLUSIVE, BUSY, NO_DATA = ("speculate", "plain decoding", "inconclusive",
                                                "unreliable (busy machine)", "no data")


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
    further: int | None = None       # inconclusive: further prompts that would settle it at the measured spread
    why: str = ""


def decide(group: list[Evidence], level: float = LEVEL) -> Verdict:
    """Speculate only when accepted progress per millisecond beats plain decoding, with 95% confidence.

    speculate: some configuration's interval lies above 1, widened (Bonferroni) for having picked it from the
    group's k, so that trying many configurations does not manufacture a winner; the best such one is named.
    plain decoding: every configuration's 95% interval lies below 1 (each must lose; no widening is needed for
    a claim about all of them). inconclusive: neither. One prompt says nothing of how prompts differ: it
    settles nothing. A group measured while the machine was busy is unreliable, whatever its intervals say."""
    rows = [r for r in group if r.speedup and r.se is not None]
    if not rows:
        return Verdict(NO_DATA)
    k = len(rows)
    best = max(rows, key=lambda r: r.speedup)
    if any(r.busy for r in group):
        return Verdict(BUSY, best, *interval(best.speedup, best.se, best.prompts, level, log=True), k=k,
                       why="other processes used the CPU while it ran (see Machine noise)")
    wide = 1 - (1 - level) / k
    if best.prompts < 2:
        lo, hi = interval(best.speedup, best.se, best.prompts, level, log=True)
        return Verdict(INCONCLUSIVE, best, lo, hi, k=k, further=_further(rows, level, wide),
                       why="one prompt per configuration: how prompts differ is unmeasured")
    winners = [r for r in rows if interval(r.speedup, r.se, r.prompts, wide, log=True)[0] > 1]
    if winners:
        w = max(winners, key=lambda r: r.speedup)
        return Verdict(SPECULATE, w, *interval(w.speedup, w.se, w.prompts, wide, log=True), adjusted=k > 1, k=k)
    lo, hi = interval(best.speedup, best.se, best.prompts, level, log=True)
    if all(interval(r.speedup, r.se, r.prompts, level, log=True)[1] < 1 for r in rows):
        return Verdict(PLAIN, best, lo, hi, k=k)
    return Verdict(INCONCLUSIVE, best, lo, hi, k=k, further=_further(rows, level, wide))


def _further(rows: list[Evidence], level: float, wide: float) -> int | None:
    """Further prompts for the verdict to settle: for the best configuration's widened interval to clear 1 when
    it leads, else for every configuration's interval to fall below 1. None: not within reach."""
    best = max(rows, key=lambda r: r.speedup)
    n = best.prompts
    if best.speedup > 1:
        m = prompts_to_settle(best.speedup, best.se, n, wide)
    else:
        need = [prompts_to_settle(r.speedup, r.se, r.prompts, level) for r in rows
                if n < 2 or interval(r.speedup, r.se, r.prompts, level, log=True)[1] >= 1]
        m = None if None in need else max(need, default=n)
    return None if m is None else m - n
