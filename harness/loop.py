"""The generation loop: speculative (a proposer and the target verifier) and plain decoding, the same code
path with gamma = 0. Each step becomes one trace record; each generation one more."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np

from harness.divergence import margin as top2_margin
from harness.engine import Engine
from harness.errors import HarnessError
from harness.promptcache import PromptCache, evaluate_prompt, timed
from harness.proposers import Proposal
from harness.sampling import Policy, process, top_prob
from harness.trace import TraceWriter
from harness.verify import verify_exact, verify_greedy, verify_stochastic


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


def generate(target: Engine, req: Request, policy: Policy, proposer=None, gamma=0,
             trace: TraceWriter | None = None, mode: str | None = None, rule: str = "leviathan",
             cache: PromptCache | None = None) -> dict:
    """Generate up to req.max_tokens after req.tokens. With no proposer (or gamma 0) this is plain decoding.
    gamma is a fixed draft length or a controller (costmodel.AdaptiveGamma) with begin(), choose(remaining) and
    observe(alphas, proposed, draft_ms, verify_ms). rule: how sampled drafts are verified (proposers.RULES).
    cache: the run's prompt cache, for the target's prompt (the proposer holds its own); a prompt restored from
    it has no evaluation time, and the generation then no latency (None)."""
    ctl = gamma if hasattr(gamma, "choose") else None
    if ctl:
        ctl.begin()
    mode = mode or ("baseline" if proposer is None else "speculative")
    trace = trace or TraceWriter(None)
    rng, draft_rng = streams(policy, req)
    eog = target.vocab.is_eog
    ctx = list(req.tokens)
    out: list[int] = []
    from_draft: list[bool] = []
    target.reset()
    target.perf_reset()
    prompt_ms = timed(cache, lambda: evaluate_prompt(target, ctx[:-1], cache))
    draft_prefill_ms = 0.0
    if proposer is not None:
        proposer.rng = draft_rng
        draft_prefill_ms = timed(cache, lambda: proposer.prefill(ctx, policy))
    t_gen = time.perf_counter()
    instr_total = 0.0
    stop, stop_token = "max_tokens", None
    step = drafted = 0  # drafted: steps that ran the proposer
    while len(out) < req.max_tokens:
        remaining = req.max_tokens - len(out)
        g = 0 if proposer is None else ctl.choose(remaining) if ctl else min(gamma, remaining - 1)
        drafted += g > 0
        s0 = time.perf_counter()
        prop = proposer.propose(ctx, g) if g > 0 else Proposal()
        s1 = time.perf_counter()
        block = [ctx[-1], *prop.tokens]
        logits = target.decode(block, logits="all")
        s2 = time.perf_counter()
        n_prop = len(prop.tokens)
        verdict = check(logits, prop, policy, rng, rule)
        i0 = time.perf_counter()
        conf = [top_prob(row) for row in logits[:n_prop + 1]]
        margin = top2_margin(logits[0]) if n_prop == 0 and mode == "baseline" and policy.greedy else None
        instr = time.perf_counter() - i0
        o = outcome(verdict, prop, eog, remaining)
        k, rejected_at, new, src = o.accepted, o.rejected_at, o.new, o.src
        if o.stop_token is not None:
            stop, stop_token = "eos", o.stop_token
        ctx += new
        out += new
        from_draft += src
        target.trim(len(ctx) - 1)
        if proposer is not None and stop != "eos":
            proposer.accepted(ctx, k)
        s3 = time.perf_counter()
        instr_total += instr
        if ctl:  # each model's first decode in a generation pays a one-off warm-up (1.5-2x): not a cost to learn
            ctl.observe(verdict.alpha[:k + (rejected_at is not None)], n_prop, (s1 - s0) * 1e3 if drafted > 1 else None,
                        (s2 - s1) * 1e3 if step else None)
        rec = {"type": "step", "step": step, "gamma": g, "proposed": n_prop, "accepted": k,
               "accepted_raw": verdict.accepted,
               "rejected_at": rejected_at, "token": verdict.token, "emitted": len(new),
               "alpha": [round(a, 6) for a in verdict.alpha], "target_conf": [round(c, 6) for c in conf],
               "draft_ms": (s1 - s0) * 1e3, "verify_ms": (s2 - s1) * 1e3,
               "overhead_ms": (s3 - s2 - instr) * 1e3}
        if margin is not None:
            rec["margin"] = round(margin, 5)
        trace.write(rec)
        step += 1
        if stop == "eos":
            break
    t_end = time.perf_counter()
    gen_ms = (t_end - t_gen - instr_total) * 1e3
    perf = target.perf()
    latency = None if prompt_ms is None or draft_prefill_ms is None else gen_ms + prompt_ms + draft_prefill_ms
    rec = {"type": "generation", "mode": mode, "prompt_id": req.prompt_id, "category": req.category,
           "prompt_tokens": len(req.tokens), "n_tokens": len(out), "tokens": out,
           "from_draft": "".join("d" if s else "t" for s in from_draft),
           "text": target.vocab.detokenize(out), "stop": stop, "stop_token": stop_token, "steps": step,
           "prompt_cached": prompt_ms is None, "prompt_eval_ms": prompt_ms, "draft_prefill_ms": draft_prefill_ms,
           "gen_ms": gen_ms, "latency_ms": latency, "instrument_ms": instr_total * 1e3,
           "tokens_per_s": len(out) / gen_ms * 1e3 if gen_ms > 0 else 0.0,
           "llama_eval_ms": perf["eval_ms"], "llama_n_eval": perf["n_eval"]}
    trace.write(rec)
    return rec
