"""The generation loop: speculative (a proposer and the target verifier) and plain decoding, the same code
path with gamma = 0. Each step becomes one trace record; each generation one more.

A sequence's step after the target's decode (`advance`) is shared with the slots loop (concurrency/loop.py).
Not one slot of it: this one takes any Proposer, the adaptive controller, the prompt cache and the single-sequence
decode that runs at llama-bench's speed; that one needs sequence ids and its own batched draft. With one slot it now
runs at the same speed (ratios 0.996-1.007, docs/findings/harness-self-prediction.md "The engine"): what keeps the
two apart is only what the slots loop lacks (the n-gram proposer, the adaptive controller, the prompt cache)."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from harness.divergence import margin as top2_margin
from harness.drafting import Proposal
from harness.engine import Engine
from harness.errors import HarnessError
from harness.gamma import gamma_cap
from harness.promptcache import PromptCache, evaluate_prompt, timed
from harness.sampling import Policy, process, top_prob
from harness.trace import TraceWriter
from harness.verify import Verdict, verify_exact, verify_greedy, verify_stochastic


@dataclass
class Request:
    prompt_id: str
    tokens: list[int]
    max_tokens: int
    category: str = ""
    repeat: int = 0


def streams(policy: Policy, req: Request) -> tuple[np.random.Generator, np.random.Generator]:
    """The target's and the draft's random streams for one generation, from the policy's seed, the prompt and the
    repeat: independent across prompts and repeats, reproducible, and the same for a speculative generation and
    its plain twin (under the exact rule the target then samples what the twin sampled)."""
    key = [policy.seed, req.repeat, zlib.crc32(req.prompt_id.encode())]
    return np.random.default_rng([*key, 0]), np.random.default_rng([*key, 1])


def check_fits(n_prompt: int, max_tokens: int, gamma_max: int, n_ctx: int) -> None:
    if n_prompt == 0:
        raise HarnessError("the prompt is empty")
    need = n_prompt + max_tokens + gamma_max + 1
    if need > n_ctx:
        raise HarnessError(f"prompt ({n_prompt} tokens) + max tokens ({max_tokens}) + gamma ({gamma_max}) "
                           f"need {need} positions but n_ctx is {n_ctx}: raise --n-ctx or shorten the prompt")


def check(logits: np.ndarray, prop: Proposal, policy: Policy, rng: np.random.Generator, rule: str):
    """The verifier over the target's logits rows for a block (its last token and the proposals)."""
    drafts = np.asarray(prop.tokens, dtype=np.int64)
    if policy.greedy:
        return verify_greedy(drafts, logits.argmax(axis=1))
    p = [process(row, policy) for row in logits]
    return verify_exact(drafts, p, rng) if rule == "exact" else verify_stochastic(drafts, prop.q, p, rng)


@dataclass(frozen=True)
class Outcome:
    """What a verification step adds to the output."""
    new: list[int]
    src: list[bool]           # per new token: from the draft
    accepted: int             # accepted drafts the output contains
    rejected_at: int | None
    stop_token: int | None    # the end-of-generation token that ended it


def outcome(verdict, prop: Proposal, eog, remaining: int) -> Outcome:
    """The accepted drafts and the correction/bonus token, cut at an end-of-generation token and at the tokens
    still wanted."""
    k = verdict.accepted
    rejected_at = k if k < len(prop.tokens) else None
    new, src, stop_token = [*prop.tokens[:k], verdict.token], [True] * k + [False], None
    for j, t in enumerate(new):
        if eog(t):
            new, src, stop_token = new[:j], src[:j], t
            if j < k:  # an accepted draft ended the output: count only the drafts the output contains
                k, rejected_at = j, None
            break
    return Outcome(new[:remaining], src[:remaining], k, rejected_at, stop_token)


@dataclass
class Seq:
    """One generation's state, what each step extends; rng: its target stream (streams())."""
    ctx: list[int]
    rng: np.random.Generator
    out: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    steps: int = 0
    stop: str = "max_tokens"
    stop_token: int | None = None


@dataclass(frozen=True)
class Advanced:
    """A step's result for its sequence: the verdict, what it added, its trace record's fields (the loop adds its
    times) and the seconds spent on instrumentation, which no generation time counts."""
    verdict: Verdict
    outcome: Outcome
    rec: dict
    instr_s: float


def advance(s: Seq, logits: np.ndarray, prop: Proposal, g: int, policy: Policy, rule: str, eog, max_tokens: int,
            baseline: bool, trim) -> Advanced:
    """One sequence's step after the target decoded its block (`logits`: the block's rows): verify, record the
    target's confidence (and, plain greedy, its top-2 margin), extend the sequence, and roll the target's KV
    back to its context with trim(n_keep)."""
    n_prop = len(prop.tokens)
    verdict = check(logits, prop, policy, s.rng, rule)
    i0 = time.perf_counter()
    conf = [top_prob(row) for row in logits[:n_prop + 1]]
    margin = top2_margin(logits[0]) if n_prop == 0 and baseline and policy.greedy else None
    instr = time.perf_counter() - i0
    o = outcome(verdict, prop, eog, max_tokens - len(s.out))
    if o.stop_token is not None:
        s.stop, s.stop_token = "eos", o.stop_token
    s.ctx += o.new
    s.out += o.new
    s.from_draft += o.src
    trim(len(s.ctx) - 1)
    rec = {"type": "step", "step": s.steps, "gamma": g, "proposed": n_prop, "accepted": o.accepted,
           "accepted_raw": verdict.accepted, "rejected_at": o.rejected_at, "token": verdict.token,
           "emitted": len(o.new), "alpha": [round(a, 6) for a in verdict.alpha],
           "target_conf": [round(c, 6) for c in conf]}
    if margin is not None:
        rec["margin"] = round(margin, 5)
    s.steps += 1
    return Advanced(verdict, o, rec, instr)


def generate(target: Engine, req: Request, policy: Policy, proposer=None, gamma=0,
             trace: TraceWriter | None = None, mode: str | None = None, rule: str = "leviathan",
             cache: PromptCache | None = None) -> dict:
    """Generate up to req.max_tokens after req.tokens. With no proposer (or gamma 0) this is plain decoding.
    gamma is a fixed draft length or a controller (costmodel.AdaptiveGamma) with begin(), choose(remaining) and
    observe(alphas, proposed, draft_ms, verify_ms). rule: how sampled drafts are verified (drafting.RULES).
    cache: the run's prompt cache, for the target's prompt (the proposer holds its own); a prompt restored from
    it has no evaluation time, and the generation then no latency (None)."""
    ctl = gamma if hasattr(gamma, "choose") else None
    if ctl:
        ctl.begin()
    mode = mode or ("baseline" if proposer is None else "speculative")
    trace = trace or TraceWriter(None)
    rng, draft_rng = streams(policy, req)
    eog = target.vocab.is_eog
    s = Seq(list(req.tokens), rng)
    target.reset()
    target.perf_reset()
    prompt_ms = timed(cache, lambda: evaluate_prompt(target, s.ctx[:-1], cache))
    draft_prefill_ms = 0.0
    if proposer is not None:
        proposer.rng = draft_rng
        draft_prefill_ms = timed(cache, lambda: proposer.prefill(s.ctx, policy))
    t_gen = time.perf_counter()
    instr_total = 0.0
    drafted = 0  # steps that ran the proposer
    while len(s.out) < req.max_tokens:
        remaining = req.max_tokens - len(s.out)
        g = 0 if proposer is None else ctl.choose(remaining) if ctl else gamma_cap(gamma, remaining)
        drafted += g > 0
        s0 = time.perf_counter()
        prop = proposer.propose(s.ctx, g) if g > 0 else Proposal()
        s1 = time.perf_counter()
        logits = target.decode([s.ctx[-1], *prop.tokens], logits="all")
        s2 = time.perf_counter()
        a = advance(s, logits, prop, g, policy, rule, eog, req.max_tokens, mode == "baseline", target.trim)
        if proposer is not None and s.stop != "eos":
            proposer.accepted(s.ctx, a.outcome.accepted)
        elif proposer is not None and hasattr(proposer, "ended"):  # llama-server reports an ending step's
            proposer.ended(a.verdict.accepted)  # acceptance too, to state that outlives the generation (llamangram)
        s3 = time.perf_counter()
        instr_total += a.instr_s
        if ctl:  # each model's first decode in a generation pays a one-off warm-up (1.5-2x): not a cost to learn
            k = a.outcome.accepted
            ctl.observe(a.verdict.alpha[:k + (a.outcome.rejected_at is not None)], len(prop.tokens),
                        (s1 - s0) * 1e3 if drafted > 1 else None, (s2 - s1) * 1e3 if s.steps > 1 else None)
        trace.write(a.rec | {"draft_ms": (s1 - s0) * 1e3, "verify_ms": (s2 - s1) * 1e3,
                             "overhead_ms": (s3 - s2 - a.instr_s) * 1e3})
        if s.stop == "eos":
            break
    t_end = time.perf_counter()
    gen_ms = (t_end - t_gen - instr_total) * 1e3
    perf = target.perf()
    latency = None if prompt_ms is None or draft_prefill_ms is None else gen_ms + prompt_ms + draft_prefill_ms
    rec = {"type": "generation", "mode": mode, "prompt_id": req.prompt_id, "category": req.category,
           "prompt_tokens": len(req.tokens), "n_tokens": len(s.out), "tokens": s.out,
           "from_draft": "".join("d" if x else "t" for x in s.from_draft),
           "text": target.vocab.detokenize(s.out), "stop": s.stop, "stop_token": s.stop_token, "steps": s.steps,
           "prompt_cached": prompt_ms is None, "prompt_eval_ms": prompt_ms, "draft_prefill_ms": draft_prefill_ms,
           "gen_ms": gen_ms, "latency_ms": latency, "instrument_ms": instr_total * 1e3,
           "tokens_per_s": len(s.out) / gen_ms * 1e3 if gen_ms > 0 else 0.0,
           "llama_eval_ms": perf["eval_ms"], "llama_n_eval": perf["n_eval"]}
    trace.write(rec)
    return rec
