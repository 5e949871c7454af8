"""Predicted acceptance and speedup for every proposer and gamma, from the replay records (analysis.replay) and
the decode costs measured beside them: a row per (baseline, category, proposer, gamma), with the intervals of
analysis.intervals (a bootstrap over the category's prompts; under greedy also over the replayed steps)."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from harness.analysis.intervals import Generation, Row, row_intervals, step_matrix
from harness.analysis.replay import Step, expected, greedy_steps, ngram_steps, replay_step, step_ms
from harness.costmodel import Costs

FIGURES = ("speedup", "acceptance_rate", "mean_accepted_len", "alpha")


def costs_at(rec: dict, context: float, plain_ms: float | None, overhead_ms: float | None = None) -> Costs:
    """A costs record (measured in a worker or beside the replay) at `context` cached tokens (linear between its
    contexts). One decode costs what plain decoding measured per token (less the loop's overhead), where known:
    the plain twins ran on the real prompts, seconds from the rows; the verification blocks and the draft's
    decodes cost what was measured."""
    if "target_ms" in rec:  # a record from before two contexts were measured
        rec = rec | {"contexts": [rec["context"]], "target_ms_by_context": [rec["target_ms"]],
                     "draft_ms_by_context": [rec.get("draft_ms") or []]}
    xs = rec["contexts"]
    w = 0.0 if len(xs) == 1 or context <= xs[0] else 1.0 if context >= xs[-1] else (context - xs[0]) / (xs[-1] - xs[0])

    def at(rows):
        return [a + w * (b - a) for a, b in zip(rows[0], rows[-1])] if rows and rows[0] else []
    t, d = at(rec["target_ms_by_context"]), at(rec.get("draft_ms_by_context") or [])
    oh = rec.get("overhead_ms", 0.0) if overhead_ms is None else overhead_ms
    if plain_ms:
        t = [max(plain_ms - oh, 1e-6), *t[1:]]
    return Costs(t, d[0] if d else 0.0, oh, draft_curve=tuple(d))


def _plain(n: int, eos: bool, costs: Costs) -> np.ndarray:
    """The plain twin: n tokens in n steps (one more to produce the end of generation)."""
    ms = costs.verify(1) + costs.overhead_ms
    return step_matrix([1] * n + [0] * eos, [ms] * (n + eos), None, None, None, None, ms * (n + eos), spec=False)


def adaptive_steps(match: list[bool], n: int, max_tokens: int, gamma_max: int, eos: bool,
                   costs: Costs) -> list[tuple[Step, int]]:
    """Greedy steps with gamma chosen per step by the adaptive controller (costmodel.AdaptiveGamma) told what
    each step accepted and cost, as the loop tells it; with each step's catch-up backlog."""
    from harness.costmodel import AdaptiveGamma
    ctl = AdaptiveGamma(costs, gamma_max)
    ctl.begin()
    steps, j, backlog = [], 0, 0
    while j < n + eos and j < max_tokens:
        g = ctl.choose(max_tokens - j)
        k = 0
        while k < g and j + k < len(match) and match[j + k]:
            k += 1
        step, ended = replay_step(j, g, k, n, eos)
        ctl.observe([1.0] * step.accepted + [0.0] * step.rejected, g,
                    step_ms(step, costs, g, backlog) - costs.verify(g + 1) - costs.overhead_ms * (g + 1) if g else None,
                    costs.verify(g + 1))
        steps.append((step, backlog))
        backlog = 0 if g else backlog + 1
        j += step.emitted
        if ended:
            break
    return steps


def generation(prompt: dict, rep: dict | None, proposer: str, gamma: int, costs: Costs, greedy: bool,
               lookup=None, adaptive: bool = False) -> Generation | None:
    """The predicted speculative generation of one prompt beside its plain twin (adaptive: gamma chosen per step
    up to `gamma`, greedy and a draft model only)."""
    out, n, eos, m = prompt["tokens"], len(prompt["tokens"]), prompt["stop_token"] is not None, prompt["max_tokens"]
    if greedy:
        if adaptive:
            if rep is None:
                return None
            sb = adaptive_steps([bool(x) for x in rep["match"]], n, m, gamma, eos, costs)
            steps, ms = [s for s, _ in sb], [step_ms(s, costs, s.proposed, b) for s, b in sb]
        elif lookup is not None:
            steps = ngram_steps(prompt["prompt_tokens"], out, prompt["stop_token"], m, gamma, lookup)
            ms = [step_ms(s, costs, gamma) for s in steps]
        elif rep is not None:
            steps = greedy_steps([bool(x) for x in rep["match"]], n, m, gamma, eos)
            ms = [step_ms(s, costs, gamma) for s in steps]
        else:
            return None
        spec = step_matrix([s.emitted for s in steps], ms, [s.accepted for s in steps], [s.proposed for s in steps],
                           [s.accepted for s in steps], [s.accepted + s.rejected for s in steps], sum(ms), spec=True)
    else:
        if rep is None:
            return None
        blocks = rep.get("alpha_blocks")
        e = expected(rep.get("alpha"), n, m, gamma, eos, costs, blocks)
        # alpha at the positions a step's first draft tests (over the lookup's proposals where it had any)
        first = [b[0] for b in blocks if b] if blocks is not None else rep["alpha"][:n + eos]
        spec = step_matrix([n], [e["ms"]], [e["accepted"]], [e["proposed"]], [sum(first)], [len(first)], e["ms"],
                           spec=True)
        spec[:, 6] = e["vsteps"]  # verification steps: expected, not one
    return Generation(spec, _plain(n, eos, costs))


def predictions(records: list[dict], plain_ms: dict, gamma_max: int) -> list[dict]:
    """Rows {config, policy, category, proposer, verify, gamma, kind, prompts, figure, figure_lo, figure_hi, ...}
    from one run's replay records (proposer: the draft as the tables name it, its rule included);
    plain_ms[(config, category)] is the measured plain ms per token."""
    from harness.proposers import Drafting
    prompts = defaultdict(list)
    reps, costs = {}, {}
    for r in records:
        if r["type"] == "replay_prompt":
            prompts[(r["config"], r["policy"])].append(r)
        elif r["type"] == "replay":
            reps[(r["config"], r["policy"], r["prompt_id"], r["proposer"])] = r
        elif r["type"] == "costs" and "proposer" in r:
            costs[(r["config"], r["policy"], r["proposer"])] = r
    out = []
    for (config, policy, name), crec in costs.items():
        greedy = policy == "greedy"
        # under sampling a draft model's replay also holds p(its top token): llama.cpp's rule, replayed beside
        exact = not greedy and any("alpha_exact" in r for k, r in reps.items() if k[:2] == (config, policy)
                                   and k[3] == name)
        for rule in ("leviathan", "exact")[:1 + exact]:
            out += _rows(config, policy, name, Drafting(rule), crec, prompts, reps, plain_ms, gamma_max)
    return out


def _rows(config: str, policy: str, proposer: str, drafting, crec: dict, prompts: dict, reps: dict, plain_ms: dict,
          gamma_max: int) -> list[dict]:
    from harness.pair import parse_ngram
    from harness.proposers import NgramProposer
    greedy, label, out = policy == "greedy", drafting.label(proposer), []
    n = parse_ngram(proposer)
    lookup = (lambda ctx, k, ng=NgramProposer(n): ng.propose(ctx, k).tokens) if n is not None and greedy else None
    by_cat = defaultdict(list)
    for p in prompts[(config, policy)]:
        by_cat[p["category"]].append(p)
    for cat, ps in by_cat.items():
        context = float(np.mean([len(p["prompt_tokens"]) + len(p["tokens"]) / 2 for p in ps]))
        c = costs_at(crec, context, plain_ms.get((config, cat)))
        # every fixed gamma; and, greedy with a draft model, the adaptive controller up to gamma_max
        runs = [(g, False) for g in range(1, gamma_max + 1)] + [(gamma_max, True)] * (greedy and lookup is None)
        for gamma, adaptive in runs:
            gens = [generation(p, _as_rule(reps.get((config, policy, p["prompt_id"], proposer)), drafting.verify),
                               proposer, gamma, c, greedy, lookup, adaptive) for p in ps]
            row = Row([[g] for g in gens if g is not None])
            if not row.prompts:
                continue
            iv = row_intervals(row, f"replay/{config}/{cat}/{label}/{gamma}" + ("/auto" if adaptive else ""))
            out.append({"config": config, "policy": policy, "category": cat, "proposer": label, "draft": proposer,
                        "verify": drafting.verify,
                        "gamma": gamma, "adaptive": adaptive, "kind": "exact" if greedy else "expected",
                        "prompts": iv["prompts"], "proposed": float(sum(g.spec[:, 5].sum() for g in gens if g))}
                       | {f"{f}{s}": iv[f"{f}{s}"] for f in FIGURES for s in ("", "_lo", "_hi", "_se")})
    return out


def _as_rule(rep: dict | None, verify: str) -> dict | None:
    """A replay record as the rule sees it: under llama.cpp's, a position is accepted with p(draft's top token)."""
    return rep if rep is None or verify != "exact" else rep | {"alpha": rep["alpha_exact"]}
