"""Replay: speculative decoding's acceptance, for every gamma, from plain decoding's own output.

Greedy. A draft's proposals up to the first rejection are its own predictions along the target's output (each
accepted token is the output's token), so one teacher-forced pass of the draft over prompt + output gives, per
output position j, whether its proposal there matches: `match[j]`. From that vector, the steps of speculative
decoding at any gamma are exact: proposed, accepted, where each stopped. (Exact up to kernel near-ties: the
loop's own run can leave plain decoding where the target's top two logits are nearly tied.) An n-gram proposer's
proposals are recomputed from the same contexts.

Sampling. Along the target's own (sampled) output, alpha[j] = sum min(p, q) at position j is the probability
that a draft token there is accepted (Leviathan et al.); the expected steps, acceptance and time at any gamma
follow by dynamic programming over positions. These are *expected*, never *measured*. Under llama.cpp's rule
("exact") the target samples with the plain twin's own random draws, one per token, so its output is the twin's
and the draft's top token is kept where it is the output's: its steps replay exactly, as greedy's do.

Positions run 0..n-1 over the output's tokens and, when the output ended at an end-of-generation token, n for
that token: a step that reaches it ends the generation (the loop does not count it as emitted or accepted).
llama.cpp's n-gram types, stateful, are replayed with their state, as the loop drives them."""
from __future__ import annotations

from typing import Sequence

from harness.costmodel import Step, price
from harness.gamma import gamma_cap
from harness.llamangram import proposer
from harness.sampling import Policy
from harness.specs import LlamaNgram


def _advance(j: int, k: int, n: int, eos: bool) -> tuple[int, int, bool]:
    """After a step from position j that accepted k drafts: (accepted as counted, emitted, ended). The step's
    tokens sit at positions j..j+k; the end-of-generation token at n, when reached, ends the output there."""
    if eos and j + k >= n:
        return min(k, n - j), n - j, True
    return k, k + 1, False


def replay_step(j: int, proposed: int, k: int, n: int, eos: bool) -> tuple[Step, bool]:
    """A step from position j that proposed `proposed` drafts and matched k of them in a row."""
    acc, emitted, ended = _advance(j, k, n, eos)
    return Step(proposed, acc, emitted, k < proposed and not (eos and n - j < k)), ended


def greedy_steps(match: Sequence[bool], n: int, max_tokens: int, gamma: int, eos: bool) -> list[Step]:
    """Steps of greedy speculative decoding at a fixed gamma, as the loop runs them (gamma capped by the tokens
    left), from the draft's per-position matches (n + eos entries)."""
    steps, j = [], 0
    while j < n + eos and j < max_tokens:
        g = gamma_cap(gamma, max_tokens - j)
        k = 0
        while k < g and j + k < len(match) and match[j + k]:
            k += 1
        step, ended = replay_step(j, g, k, n, eos)
        steps.append(step)
        j += step.emitted
        if ended:
            break
    return steps


def ngram_steps(context: Sequence[int], out: Sequence[int], eos_token: int | None, max_tokens: int, gamma: int,
                propose, after=None) -> list[Step]:
    """Steps with a proposer that looks its proposals up in the context (propose(context, n) -> tokens): each
    step's proposals recomputed from the prompt and the output so far; eos_token: the end-of-generation token
    the output ended on, or None. after(context, k, ended): told each step's k matched drafts, as the loop tells
    a stateful proposer."""
    target = [*out, eos_token] if eos_token is not None else list(out)
    n, eos = len(out), eos_token is not None
    steps, j = [], 0
    while j < n + eos and j < max_tokens:
        g = gamma_cap(gamma, max_tokens - j)
        tokens = propose([*context, *out[:j]], g) if g > 0 else []
        k = 0
        while k < len(tokens) and j + k < len(target) and tokens[k] == target[j + k]:
            k += 1
        step, ended = replay_step(j, len(tokens), k, n, eos)
        steps.append(step)
        j += step.emitted
        if after is not None:
            after([*context, *out[:j]], k, ended)
        if ended:
            break
    return steps


def llama_ngram_steps(prompt: Sequence[int], out: Sequence[int], eos_token: int | None, max_tokens: int,
                      spec: LlamaNgram) -> list[Step]:
    """Steps of one of llama.cpp's n-gram types at its own gamma: a fresh proposer (llamangram), called as the
    loop calls it. Exact under greedy and under llama.cpp's rule (the output is the plain twin's); under
    Leviathan's, a point-mass draft is kept with probability p(x) and the token comes from p, so the twin's output
    is one realization of the same process."""
    p = proposer(spec)
    p.prefill(list(prompt), Policy())

    def after(context: list[int], k: int, ended: bool) -> None:
        if ended:
            p.ended(k)
        else:
            p.accepted(context, k)
    return ngram_steps(prompt, out, eos_token, max_tokens, spec.own_gamma, lambda c, n: p.propose(c, n).tokens, after)


def expected(alpha: Sequence[float] | None, n: int, max_tokens: int, gamma: int, eos: bool, costs=None,
             blocks: Sequence[Sequence[float]] | None = None) -> dict:
    """Expected steps, verification steps (those that proposed), proposed, accepted, each kind of step's expected
    count ("kinds": {Step: count}, what prices the steps under any costs) and (with costs) milliseconds of
    speculative decoding at a fixed gamma: a dynamic program over positions, forward from the start, over the
    probability that a step starts at each. A draft model's token at position j is accepted with probability
    alpha[j], independently. A lookup proposer (n-gram) instead proposes, from a step that starts at j, the tokens
    it found there, accepted with probabilities blocks[j] (as many as it proposes; none: a plain step)."""
    end = min(n + eos, max_tokens)
    start = [1.0] + [0.0] * end  # P(a step starts at position j)
    out = {"steps": 0.0, "vsteps": 0.0, "proposed": 0.0, "accepted": 0.0}
    kinds: dict[Step, float] = {}
    for j in range(end):
        if not start[j]:
            continue
        probs = blocks[j] if blocks is not None else alpha[j:]
        g = min(gamma_cap(gamma, max_tokens - j), len(probs) if blocks is not None else gamma)
        out["steps"] += start[j]
        out["vsteps"] += start[j] * (g > 0)
        out["proposed"] += start[j] * g
        reach = 1.0  # P(the first k drafts accepted)
        for k in range(g + 1):
            a_k = probs[k] if k < min(g, len(probs)) else 0.0
            p = start[j] * (reach * (1 - a_k) if k < g else reach)  # P(a step at j accepting exactly k)
            if p > 0:
                step, ended = replay_step(j, g, k, n, eos)
                kinds[step] = kinds.get(step, 0.0) + p
                out["accepted"] += p * step.accepted
                if not ended and j + step.emitted < end:
                    start[j + step.emitted] += p
            reach *= a_k
    ms = sum(w * price(s.shape(), costs) for s, w in kinds.items()) if costs is not None else 0.0
    return out | {"kinds": kinds, "ms": ms}
