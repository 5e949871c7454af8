"""Predicted acceptance and speedup for every proposer and gamma, from the replay records (analysis.replay) and
the decode costs measured beside them: a row per (baseline, category, proposer, gamma), with the intervals of
analysis.intervals (a bootstrap over the category's prompts; where the steps are replayed exactly, also over
them), the speedup's widened by the decode costs' own uncertainty where their record measured it."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from statistics import NormalDist

import numpy as np
import polars as pl

from harness.analysis.intervals import (REPLICATES, Generation, Row, pooled_sums, row_sums, step_matrix,
                                       sums_intervals, widened)
from harness.analysis.replay import expected, greedy_steps, llama_ngram_steps, ngram_steps, replay_step
from harness.costmodel import AdaptiveGamma, Costs, Step, price, read
from harness.drafting import Drafting, ngram_lookup
from harness.specs import DraftSpec, LlamaNgram, parse_draft

FIGURES = ("speedup", "acceptance_rate", "mean_accepted_len", "alpha")
PLAIN = Step(0, 0, 1)  # a plain decode
ALL = "all"  # the category of a row over every category at once


def plain_decode_ms(gens: pl.DataFrame) -> dict[tuple[str, str], float]:
    """{(config, category): ms per decode} of plain generations: their time over their decodes, the one that
    produced the end of generation included. What one decode costs in Costs.levelled: per token instead, the plain
    twin of n tokens and an end (n + 1 decodes) would cost (n + 1) / n times what was measured."""
    if not len(gens):
        return {}
    g = gens.group_by("config", "category").agg(pl.col("gen_ms").sum(), pl.col("steps").sum())
    return {(r["config"], r["category"]): r["gen_ms"] / r["steps"] for r in g.iter_rows(named=True) if r["steps"]}


def speedup_bound(costs: Costs, gamma: int) -> float:
    """The most any acceptance can give at gamma (at most, for an adaptive gamma): a step emits at most gamma + 1
    tokens and costs at least the verification of gamma + 1 rows and gamma draft decodes, against one plain decode,
    each as measured. A predicted speedup beyond it comes from a plain pace the measured costs cannot have."""
    plain = price(PLAIN.shape(), costs)
    return max((g + 1) * plain / (costs.verify(g + 1) + costs.overhead(g + 1) + g * costs.draft_ms)
               for g in range(1, gamma + 1))


def cost_draws(rec: dict, n: int, key: str) -> dict | None:
    """The costs record with each measured median as n draws around it: normal, with the median's standard error
    from its repetitions' spread (sqrt(pi/2) sd / sqrt(reps)), independent per context and k, floored above zero;
    seeded by `key`. The draws are the normal's n quantiles in a shuffled order (a Latin hypercube), so that their
    spread is the normal's to 0.1%, not to a few %. None for a record without spreads (from before they were
    kept): its costs count as exact."""
    if "target_sd_by_context" not in rec:
        return None
    rng = np.random.default_rng(list(key.encode()))
    f = math.sqrt(math.pi / 2 / rec["reps"])
    z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])

    def draw(ms_rows, sd_rows):
        return [[np.maximum(m + f * s * rng.permutation(z), 1e-6) for m, s in zip(ms, sd)]
                for ms, sd in zip(ms_rows, sd_rows)]
    out = rec | {"target_ms_by_context": draw(rec["target_ms_by_context"], rec["target_sd_by_context"])}
    if rec.get("draft_sd_by_context"):  # a lookup's own time has none
        out["draft_ms_by_context"] = draw(rec["draft_ms_by_context"], rec["draft_sd_by_context"])
    return out


def cost_sd(parts: list[tuple[Counter, float, Costs]]) -> float:
    """The log speedup's spread over cost draws: the plain twins' time (`decodes` plain decodes) over the
    speculative steps' (kinds: {(step, backlog): count}), both priced under every draw, summed over the parts
    (kinds, decodes, draws) of a row (its categories, each at its own levelled costs, drawn together)."""
    spec = sum(w * price(s.shape(b), d) for kinds, _, d in parts for (s, b), w in kinds.items())
    plain = sum(n * price(PLAIN.shape(), d) for _, n, d in parts)
    x = np.atleast_1d(np.log(plain / spec))
    return float(x.std(ddof=1)) if x.size > 1 else 0.0


def _plain(n: int, eos: bool, costs: Costs) -> np.ndarray:
    """The plain twin: n tokens in n decodes, one more to produce the end of generation."""
    ms = price(PLAIN.shape(), costs)
    return step_matrix([1] * n + [0] * eos, [ms] * (n + eos), None, None, None, None, ms * (n + eos), spec=False)


def adaptive_steps(match: list[bool], n: int, max_tokens: int, gamma_max: int, eos: bool,
                   costs: Costs) -> list[tuple[Step, int]]:
    """Greedy steps with gamma chosen per step by the adaptive controller (costmodel.AdaptiveGamma) told what
    each step accepted and cost, as the loop tells it; with each step's catch-up backlog."""
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
                    price(step.shape(backlog), costs) - costs.verify(g + 1) - costs.overhead(g + 1) if g else None,
                    costs.verify(g + 1))
        steps.append((step, backlog))
        backlog = 0 if g else backlog + 1
        j += step.emitted
        if ended:
            break
    return steps


def generation(prompt: dict, rep: dict | None, gamma: int, costs: Costs, exact: bool, lookup=None,
               adaptive: bool = False) -> tuple[Generation, Counter] | None:
    """The predicted speculative generation of one prompt beside its plain twin, and how many steps of each kind
    it took ({(step, backlog): count}, expected counts where expected), to price them under other costs. exact:
    its steps replayed from the draft's matches, or from a model-free proposer's own proposals (lookup(prompt,
    gamma) -> steps), else expected from alpha. adaptive: gamma chosen per step up to `gamma` (exact, a draft
    model only)."""
    n, eos, m = len(prompt["tokens"]), prompt["stop_token"] is not None, prompt["max_tokens"]
    if exact:
        if lookup is not None:
            sb = [(s, 0) for s in lookup(prompt, gamma)]
        elif rep is None:
            return None
        elif adaptive:
            sb = adaptive_steps([bool(x) for x in rep["match"]], n, m, gamma, eos, costs)
        else:
            sb = [(s, 0) for s in greedy_steps([bool(x) for x in rep["match"]], n, m, gamma, eos)]
        steps, ms = [s for s, _ in sb], [price(s.shape(b), costs) for s, b in sb]
        # alpha where verification reached: p of the draft's token under llama.cpp's rule, else whether it matched
        reached = _reached(steps, rep.get("alpha", rep["match"])) if rep is not None else [s.accepted for s in steps]
        spec = step_matrix([s.emitted for s in steps], ms, [s.accepted for s in steps], [s.proposed for s in steps],
                           reached, [s.accepted + s.rejected for s in steps], sum(ms), spec=True)
        kinds = Counter(sb)
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
        kinds = Counter({(s, 0): w for s, w in e["kinds"].items()})
    return Generation(spec, _plain(n, eos, costs)), kinds


def _reached(steps: list[Step], alpha) -> list[float]:
    """Per step, alpha summed over the positions verification reached: its accepted drafts and a rejected one."""
    out, j = [], 0
    for s in steps:
        out.append(float(sum(alpha[j:j + s.accepted + s.rejected])))
        j += s.emitted
    return out


def predictions(records: list[dict], plain_ms: dict, gamma_max: int, pooled: bool = False) -> list[dict]:
    """Rows {config, policy, category, proposer, verify, gamma, kind, prompts, figure, figure_lo, figure_hi, ...}
    from one run's replay records (proposer: the draft as the tables name it, its rule included);
    plain_ms[(config, category)] is the measured plain ms per decode (plain_decode_ms). pooled: also a row over
    every category at once (category ALL) where there are several."""
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
            out += _rows(config, policy, name, Drafting(rule), crec, prompts, reps, plain_ms, gamma_max, pooled)
    return out


def _rows(config: str, policy: str, proposer: str, drafting, crec: dict, prompts: dict, reps: dict, plain_ms: dict,
          gamma_max: int, pooled: bool) -> list[dict]:
    greedy, label, out = policy == "greedy", drafting.label(proposer), []
    spec = parse_draft(proposer)
    lookup = _lookup(spec, greedy)
    # llama.cpp's rule samples with the plain twin's own draws, so its output is the twin's: replayed exactly like
    # greedy where the draft's matches were kept (older runs kept p of its top token only: expected)
    mine = [r for k, r in reps.items() if k[:2] == (config, policy) and k[3] == proposer]
    exact = greedy or isinstance(spec, LlamaNgram) or (drafting.verify == "exact" and bool(mine)
                                                       and all("match_exact" in r for r in mine))
    draws = cost_draws(crec, REPLICATES, f"costs/{config}/{policy}/{proposer}")
    by_cat = defaultdict(list)
    for p in prompts[(config, policy)]:
        by_cat[p["category"]].append(p)
    priced = {}  # per category: its prompts, its levelled costs, and those under each cost draw
    for cat, ps in by_cat.items():
        context = float(np.mean([len(p["prompt_tokens"]) + len(p["tokens"]) / 2 for p in ps]))
        measured = read(crec).costs(context)  # the replay's own decode, not levelled: what bounds a prediction
        priced[cat] = (ps, measured, measured.levelled(plain_ms.get((config, cat))),
                       read(draws).costs(context).levelled(plain_ms.get((config, cat))) if draws else None)
    # every fixed gamma (llama.cpp's n-gram types: their own); and, greedy with a draft model, the adaptive
    # controller up to gamma_max
    runs = [(spec.own_gamma, False)] if spec.own_gamma else \
        [(g, False) for g in range(1, gamma_max + 1)] + [(gamma_max, True)] * (greedy and lookup is None)
    parts = defaultdict(list)  # per (gamma, adaptive): per category (category, generations, costs, draws)
    for cat, (ps, measured, c, cd) in priced.items():
        for gamma, adaptive in runs:
            got = [x for p in ps if (x := generation(p, _as_rule(reps.get((config, policy, p["prompt_id"], proposer)),
                                                                 drafting.verify), gamma, c, exact, lookup, adaptive))]
            if got:
                parts[(gamma, adaptive)].append((cat, got, measured, cd))
    # each category, then (where there are several) all of them at once: the run's mix of prompts, each priced at
    # its own category's levelled costs
    groups = [(cat, run, [part]) for cat in priced for run, ps in parts.items() for part in ps if part[0] == cat]
    groups += [(ALL, run, ps) for run, ps in parts.items() if pooled and len(ps) > 1]
    sums = {}  # per (category, gamma, adaptive): its bootstrap, which the row over every category pools
    for cat, (gamma, adaptive), ps in groups:
        got = [g for _, gs, _, _ in ps for g in gs]
        if cat == ALL:
            iv = sums_intervals(pooled_sums([sums[(c, gamma, adaptive)] for c, *_ in ps]))
        else:
            sums[(cat, gamma, adaptive)] = row_sums(Row([[g] for g, _ in got]),
                                                    f"replay/{config}/{cat}/{label}/{gamma}" + "/auto" * adaptive)
            iv = sums_intervals(sums[(cat, gamma, adaptive)])
        if all(cd is not None for *_, cd in ps):  # the steps as replayed, priced under each draw
            iv = widened(iv, cost_sd([(sum((k for _, k in gs), Counter()), sum(len(g.plain) for g, _ in gs), cd)
                                      for _, gs, _, cd in ps]))
        out.append({"config": config, "policy": policy, "category": cat, "proposer": label, "draft": proposer,
                    "verify": drafting.verify,
                    "gamma": gamma, "adaptive": adaptive, "kind": "exact" if exact else "expected",
                    "prompts": iv["prompts"], "proposed": float(sum(g.spec[:, 5].sum() for g, _ in got)),
                    "bound": max(speedup_bound(m, gamma) for _, _, m, _ in ps)}
                   | {f"{f}{s}": iv[f"{f}{s}"] for f in FIGURES for s in ("", "_lo", "_hi", "_se")})
    return out


def _lookup(spec: DraftSpec, greedy: bool):
    """A model-free proposer's steps along a prompt's plain output (prompt record, gamma) -> steps, where they
    replay exactly: the harness's lookup under greedy, llama.cpp's n-gram types under any policy; else None."""
    if isinstance(spec, LlamaNgram):
        return lambda p, g: llama_ngram_steps(p["prompt_tokens"], p["tokens"], p["stop_token"], p["max_tokens"], spec)
    if spec.ngram is not None and greedy:
        return lambda p, g: ngram_steps(p["prompt_tokens"], p["tokens"], p["stop_token"], p["max_tokens"], g,
                                        lambda ctx, k: ngram_lookup(ctx, spec.ngram, k))
    return None


def _as_rule(rep: dict | None, verify: str) -> dict | None:
    """A replay record as the rule sees it: under llama.cpp's, the draft's matches along the output (where kept)
    and p of its top token as alpha (a position accepted with that probability, where expected)."""
    if rep is None or verify != "exact":
        return rep
    return rep | {"alpha": rep["alpha_exact"]} | ({"match": rep["match_exact"]} if "match_exact" in rep else {})
