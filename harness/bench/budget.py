"""Fitting a new run into its time budget (`--budget-min`) before anything runs. While the estimate exceeds the
budget, cut, in this order, each step only as far as needed and never to less than its floor:

1. the prompts per category (halved, not below 5; a category with fewer keeps all);
2. the configurations: the profile's further sweeps (`also`: the default's F16 target), the last first;
3. the gammas replayed or swept (halved, not below 4);
4. the prompts' length: the longest first, each cut in its middle (prompts.Prompt.shortened) to half the longest's
   characters, not below 2048 (about 500 tokens; the long_context category's prompts run to 6,000);
5. the timed subset's configurations (every proposer's predicted best gamma and gamma 1 -> each answer's own),
   then its prompts (halved, not below 1), then the prompts of the llama-server check (halved, not below 2);
6. only then what the evidence is made of: the tokens per generation (halved, not below 64), the sampled
   policies (the main sweep keeps its coolest, greedy), and the tokens again (not below 32).

Evidence of realistic size (outputs of 128 tokens, greedy and a sampled policy, 5 prompts a category) goes last:
the verdicts rest on it. A halving that would save nothing is not made. What still does not fit runs anyway, and
says so; each cut that loses evidence or a sweep names the budget that would keep it. The run is fitted to PLANNED
of the budget, not all of it: the estimate has come out up to 18% low (on Intel Xeon VMs, 17.6 min estimated
against 20.8 taken, and 16.8 against 20.5 before the probe timed each block size; 16.3 against 17.3 after).

Pure: the caller passes the cost estimate (seconds for a parameter set) and the prompt set's shape."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from harness.plan import Params

MIN_PROMPTS, MIN_GAMMA, MIN_SUBSET, MIN_CHECK, MIN_CHARS = 5, 4, 1, 2, 2048
REALISTIC_TOKENS, MIN_TOKENS = 64, 32  # output length cut to the first before a policy goes, then to the second
PLANNED = 0.85  # the share of the budget a run is fitted to: room for the estimate's error
KEPT = ("also", "prompt_chars", "temp", "max_tokens")  # cuts that name the budget that would keep what they cut


@dataclass(frozen=True)
class Cut:
    param: str  # the Params field cut
    before: int | str | list
    after: int | str | list
    estimate_before_s: float
    estimate_after_s: float
    why: str
    hint: str = ""  # what the line adds: how to keep what was cut


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


Step = Callable[[Params], "Params | None"]


@dataclass(frozen=True)
class Shape:
    """What a run's 0s stand for: its largest category's prompts, the longest of the prompts' own max_tokens, and
    the longest prompt's characters."""
    largest_category: int
    own_max_tokens: int
    longest_prompt: int


def _steps(shape: Shape) -> list[tuple[str, Step]]:
    """(field, one cut of it), in the order they are cut; a cut is None at its floor."""
    def prompts(p: Params) -> Params | None:
        now = p.per_category or shape.largest_category
        return replace(p, per_category=max(MIN_PROMPTS, now // 2)) if now > MIN_PROMPTS else None

    def sweeps(p: Params) -> Params | None:
        return replace(p, also=p.also[:-1]) if p.also else None

    def gammas(p: Params) -> Params | None:
        # a replay predicts every gamma up to replay_gamma, and only those can be timed: the sweep follows it
        top = p.replay_gamma if p.replay else max((g.n for g in p.gamma if not g.adaptive), default=0)
        if top <= MIN_GAMMA:
            return None
        new = max(MIN_GAMMA, top // 2)
        kept = [g for g in p.gamma if g.adaptive or g.n <= new]  # auto:N keeps its own N
        return replace(p, gamma=kept, replay_gamma=new if p.replay else p.replay_gamma) if kept else None

    def length(p: Params) -> Params | None:
        now = p.prompt_chars or shape.longest_prompt
        return replace(p, prompt_chars=max(MIN_CHARS, now // 2)) if now > MIN_CHARS else None

    def scope(p: Params) -> Params | None:
        return replace(p, timed_scope="answers") if p.timed_subset and p.timed_scope != "answers" else None

    def subset(p: Params) -> Params | None:
        ok = p.replay and p.timed_subset > MIN_SUBSET
        return replace(p, timed_subset=max(MIN_SUBSET, p.timed_subset // 2)) if ok else None

    def check(p: Params) -> Params | None:
        ok = p.server_check > MIN_CHECK
        return replace(p, server_check=max(MIN_CHECK, p.server_check // 2)) if ok else None

    def tokens(floor: int) -> Step:
        def cut(p: Params) -> Params | None:
            now = p.max_tokens or shape.own_max_tokens  # 0: each prompt's own, at most own_max_tokens
            return replace(p, max_tokens=max(floor, now // 2)) if now > floor else None
        return cut

    def policy(p: Params) -> Params | None:
        return replace(p, temp=[min(p.temp)]) if len(p.temp) > 1 else None

    return [("per_category", prompts), ("also", sweeps), ("gamma", gammas), ("prompt_chars", length),
            ("timed_scope", scope), ("timed_subset", subset), ("server_check", check),
            ("max_tokens", tokens(REALISTIC_TOKENS)), ("temp", policy), ("max_tokens", tokens(MIN_TOKENS))]


def fit(params: Params, cost: Callable[[Params], float], shape: Shape) -> Fit:
    """params cut to fit params.budget_min by cost(params) (seconds), and the cuts made, each with its reason."""
    est = before = cost(params)
    if params.budget_min is None:
        return Fit(params, None, before, before)
    budget_s, p, made = params.budget_min * 60 * PLANNED, params, []
    for name, cut in _steps(shape):
        start, start_est = p, est
        while est > budget_s and (nxt := cut(p)) is not None and (nxt_est := cost(nxt)) < est:
            p, est = nxt, nxt_est
        if p is not start:
            made.append((name, start, p, start_est, est))
    # a cut may free more than the run needed (one policy fewer halves it): what the earlier cuts took comes back,
    # the most valued first, where the run still fits
    kept = []
    for name, start, end, a, b in reversed(made):
        back = replace(p, **{k: v for k, v in vars(start).items() if getattr(end, k) != v})
        if (back_est := cost(back)) <= budget_s:
            p, est = back, back_est
        else:
            kept.insert(0, (name, start, end, a, b))
    over = f"over {budget_s / 60:.1f} min ({PLANNED:.0%} of the {params.budget_min:g} min budget)"
    own = {"per_category": shape.largest_category, "max_tokens": shape.own_max_tokens,
           "prompt_chars": shape.longest_prompt}  # what 0 stands for
    cuts = tuple(_cut(name, start, end, p, (a, b, f"estimated {a / 60:.1f} min, {over}"), cost, own)
                 for name, start, end, a, b in kept)
    return Fit(p, params.budget_min, before, est, cuts)


def _cut(name: str, start: Params, end: Params, final: Params, said: tuple[float, float, str],
         cost: Callable[[Params], float], own: dict[str, int]) -> Cut:
    """One step's record (from start to end; said: the estimates before and after it, and why), as plan.json
    holds its values; for what loses evidence or a sweep, the budget that would have kept it with everything
    else as finally planned."""
    field = "replay_gamma" if name == "gamma" and end.replay else name
    was, got = getattr(start, field) or own.get(field, 0), getattr(end, field)
    if field == "gamma":
        was, got = [g.json() for g in was], [g.json() for g in got]
    elif field == "also":
        was, got = [_sweep(a) for a in was], [_sweep(a) for a in got]
    hint = ""
    if field in KEPT:
        need = cost(replace(final, **{field: getattr(start, field)})) / PLANNED / 60
        hint = f"--budget-min {math.ceil(need)} keeps {'them' if field == 'also' else 'it'}"
    return Cut(field, was, got, *said, hint)


def _sweep(extra: dict) -> str:
    """A further sweep in a few words: its lists."""
    return " ".join(f"{k} {','.join(map(str, v if isinstance(v, list) else [v]))}" for k, v in extra.items())
