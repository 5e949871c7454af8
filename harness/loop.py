"""The generation loop: speculative (a proposer and the target verifier) and plain decoding, the same code path
with gamma = 0, over N sequences in one context as llama-server's slots decode them; a single generation is a batch
of one. Each step, the proposer drafts for every active sequence, one llama_decode holds every sequence's
verification block (plain: its last token), and each sequence is verified, extended and rolled back on its own
(advance), with its request's random streams, so outputs stay lossless whatever shares its steps. A sequence that
finishes frees its slot for the next request, so the batch stays full until the requests run out.

Trace records: a step record per sequence and step, a generation record per request, and (generate_concurrent)
one "batch" record per call, whose step records also say the step's shared `batch` tokens and `active` sequences.
With one slot, the loop runs at llama-bench's speed (docs/findings/harness-self-prediction.md "The engine")."""
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
from harness.proposers import EachSequence, SlotProposer
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
    """One request's generation in its slot (sequence `seq` of the context), what each step extends; rng and
    draft_rng: its request's streams (streams()), not the slot's, so a request samples alike in any slot."""
    req: Request
    seq: int
    rng: np.random.Generator
    draft_rng: np.random.Generator
    t_enter: float = 0.0
    ctx: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    steps: int = 0
    stop: str = "max_tokens"
    stop_token: int | None = None
    prompt_ms: float | None = 0.0  # None: restored from the prompt cache
    draft_prefill_ms: float | None = 0.0
    gen_ms: float = 0.0  # the steps it took part in, less instrumentation
    instr_ms: float = 0.0
    t_first: float = 0.0  # its first step's start
    drafted: int = 0  # steps that ran the proposer


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
    """Generate up to req.max_tokens after req.tokens: a batch of one. With no proposer (or gamma 0) this is plain
    decoding. proposer: a SlotProposer, or a sequence's Proposer. gamma is a fixed draft length or a controller
    (costmodel.AdaptiveGamma) with begin(), choose(remaining) and observe(alphas, proposed, draft_ms, verify_ms).
    rule: how sampled drafts are verified (drafting.RULES). cache: the run's prompt cache, for the target's prompt
    (the proposer holds its own); a prompt restored from it has no evaluation time, and the generation then no
    latency (None). Returns the generation record."""
    return _run(target, [req], policy, 1, proposer, gamma, trace, mode, rule, cache, batch=False)[0]


def generate_concurrent(target: Engine, requests: list[Request], policy: Policy, n_parallel: int, proposer=None,
                        gamma: int = 0, trace: TraceWriter | None = None, mode: str | None = None,
                        rule: str = "leviathan") -> dict:
    """Every request through n_parallel slots of target's context (cfg.n_seq >= n_parallel), in order, with a
    fixed gamma. Writes and returns the batch record. No prompt cache: a prompt's evaluation stalls the other
    sequences' steps, which is part of what a batch's throughput measures."""
    return _run(target, requests, policy, n_parallel, proposer, gamma, trace, mode, rule, None, batch=True)[1]


def _run(target, requests, policy, n_parallel, proposer, gamma, trace, mode, rule, cache, batch):
    ctl = gamma if hasattr(gamma, "choose") else None
    if ctl and n_parallel > 1:
        raise HarnessError("the adaptive controller prices one sequence's steps, whose cost in a batch depends on "
                           "the others': use a fixed gamma with more than one slot")
    # a bare sequence-level Proposer serves every slot itself (stateless lookups, tests' scripts)
    slots = proposer if proposer is None or isinstance(proposer, SlotProposer) else EachSequence(lambda: proposer)
    mode = mode or ("baseline" if proposer is None else "speculative")
    trace = trace or TraceWriter(None)
    eog = target.vocab.is_eog
    queue, free, active, gens = list(requests), list(range(n_parallel)), [], []
    target.reset()
    if slots:
        slots.reset()
    target.perf_reset()  # llama.cpp's own decode time: the batch's, or the one generation's record
    t_start = time.perf_counter()
    step = tokens = peak = 0
    instr_total = prefill_ms = 0.0
    busy = []  # active sequences per step
    while queue or active:
        while queue and free:  # a free slot takes the next request: its prompt, then it joins the next step
            s = _enter(target, queue.pop(0), free.pop(0), policy, slots, cache)
            if ctl:
                ctl.begin()
            prefill_ms += (s.prompt_ms or 0.0) + (s.draft_prefill_ms or 0.0)
            active.append(s)
        s0 = time.perf_counter()
        gammas = [0 if slots is None else ctl.choose(s.req.max_tokens - len(s.out)) if ctl else
                  gamma_cap(gamma, s.req.max_tokens - len(s.out)) for s in active]
        for s, g in zip(active, gammas):
            s.drafted += g > 0
            s.t_first = s.t_first or s0
        props = slots.draft(active, gammas) if slots and any(gammas) else [Proposal() for _ in active]
        s1 = time.perf_counter()
        rows = [(s.seq, len(s.ctx) - 1 + j, t, True) for s, p in zip(active, props)
                for j, t in enumerate([s.ctx[-1], *p.tokens])]
        logits = target.decode_rows(rows)  # a view: nothing decodes until the step is verified
        peak = max(peak, sum(len(s.ctx) - 1 for s in active) + len(rows))  # the target's KV cells in use
        s2 = time.perf_counter()
        instr, at, done, recs = 0.0, 0, [], []
        for s, p, g in zip(active, props, gammas):
            block = logits[at:at + len(p.tokens) + 1]
            at += len(block)
            a = advance(s, block, p, g, policy, rule, eog, s.req.max_tokens, mode == "baseline",
                        lambda n, seq=s.seq: target.seq_trim(seq, n))
            instr += a.instr_s
            s.instr_ms += a.instr_s * 1e3
            if slots and s.stop != "eos":
                slots.accepted(s, a.outcome.accepted)
            elif slots:
                slots.ended(s, a.verdict.accepted)
            if ctl:  # each model's first decode in a generation pays a one-off warm-up (1.5-2x): not a cost to learn
                k = a.outcome.accepted
                ctl.observe(a.verdict.alpha[:k + (a.outcome.rejected_at is not None)], len(p.tokens),
                            (s1 - s0) * 1e3 if s.drafted > 1 else None, (s2 - s1) * 1e3 if s.steps > 1 else None)
            recs.append(a.rec | ({"batch_step": step, "seq": s.seq, "active": len(active), "batch": len(rows),
                                  "prompt_id": s.req.prompt_id, "category": s.req.category} if batch else {}))
            if s.stop == "eos" or len(s.out) >= s.req.max_tokens:
                done.append(s)
        s3 = time.perf_counter()
        instr_total += instr
        times = {"draft_ms": (s1 - s0) * 1e3, "verify_ms": (s2 - s1) * 1e3, "overhead_ms": (s3 - s2 - instr) * 1e3}
        for rec in recs:
            trace.write(rec | times)
        s4 = time.perf_counter()
        for s in active:
            s.gen_ms += (s4 - s0 - instr) * 1e3
        busy.append(len(active))
        step += 1
        for s in done:
            active.remove(s)
            free.append(s.seq)
            tokens += len(s.out)
            gens.append(_generation(target, s, mode, n_parallel, s4, solo=not batch))
            trace.write(gens[-1])
    if not batch:
        return gens[-1], None
    wall_ms = (time.perf_counter() - t_start - instr_total) * 1e3
    perf = target.perf()
    rec = {"type": "batch", "mode": mode, "parallel": n_parallel, "requests": len(requests),
           "slots_used": min(n_parallel, len(requests)), "tokens": tokens, "steps": step, "wall_ms": wall_ms,
           "prefill_ms": prefill_ms, "decode_ms": wall_ms - prefill_ms,
           "tokens_per_s": tokens / (wall_ms - prefill_ms) * 1e3 if wall_ms > prefill_ms else 0.0,
           "mean_active": float(np.mean(busy)) if busy else 0.0, "peak_positions": peak,
           "llama_eval_ms": perf["eval_ms"], "llama_n_eval": perf["n_eval"]}
    trace.write(rec)
    return None, rec


def _enter(target: Engine, req: Request, seq: int, policy: Policy, slots: SlotProposer | None,
           cache: PromptCache | None) -> Seq:
    """The request's prompt (all but its last token) into sequence seq of the target, and of the proposer's."""
    rng, draft_rng = streams(policy, req)
    s = Seq(req, seq, rng, draft_rng, time.perf_counter(), list(req.tokens))
    target.seq_trim(seq, 0)
    s.prompt_ms = timed(cache, lambda: evaluate_prompt(target, s.ctx[:-1], cache, seq))
    if slots:
        s.draft_prefill_ms = timed(cache, lambda: slots.start(s, policy))
    return s


def _generation(target: Engine, s: Seq, mode: str, n_parallel: int, t_end: float, solo: bool) -> dict:
    """A generation's record. latency_ms: its prompt and draft prefill, then from its first step to its last,
    less instrumentation (in a batch, other requests' prompts entering meanwhile delay it too)."""
    cached = s.prompt_ms is None or s.draft_prefill_ms is None
    latency = None if cached else s.prompt_ms + s.draft_prefill_ms + (t_end - s.t_first) * 1e3 - s.instr_ms
    rec = {"type": "generation", "mode": mode, "prompt_id": s.req.prompt_id, "category": s.req.category,
           "prompt_tokens": len(s.req.tokens), "n_tokens": len(s.out), "tokens": s.out,
           "from_draft": "".join("d" if x else "t" for x in s.from_draft), "text": target.vocab.detokenize(s.out),
           "stop": s.stop, "stop_token": s.stop_token, "steps": s.steps, "prompt_cached": s.prompt_ms is None,
           "prompt_eval_ms": s.prompt_ms, "draft_prefill_ms": s.draft_prefill_ms, "gen_ms": s.gen_ms,
           "latency_ms": latency, "instrument_ms": s.instr_ms,
           "tokens_per_s": len(s.out) / s.gen_ms * 1e3 if s.gen_ms > 0 else 0.0}
    if solo:
        perf = target.perf()
        return rec | {"llama_eval_ms": perf["eval_ms"], "llama_n_eval": perf["n_eval"]}
    return rec | {"seq": s.seq, "parallel": n_parallel}
