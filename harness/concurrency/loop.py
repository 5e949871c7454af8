"""Several requests decoded together, as llama-server's slots do: N sequences in one context, one llama_decode per
step holding every active sequence's token (plain) or verification block (speculative), the draft batched the
same way. A sequence that finishes frees its slot for the next request, so the batch stays full until the
requests run out. Each sequence keeps its own positions, KV range (rolled back on its own) and random streams
(its request's, as the single-sequence loop's): the verifier is loop.check per sequence, so outputs stay lossless.

Trace records: a step record per sequence and step (the step's shared draft, verify and overhead times; `batch`
tokens the target decoded in it, `active` sequences), a generation record per request (gen_ms: the steps it took
part in; latency_ms: from entering its slot to its last token), and one "batch" record per call."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from harness.divergence import margin as top2_margin
from harness.engine import Engine
from harness.loop import Request, check, outcome, streams
from harness.proposers import Drafting, NgramProposer, Proposal, draft_pick
from harness.sampling import Policy, top_prob
from harness.trace import TraceWriter


@dataclass
class Slot:
    seq: int
    req: Request
    rng: np.random.Generator
    draft_rng: np.random.Generator
    t_enter: float
    prefill_ms: float
    ctx: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    gen_ms: float = 0.0
    steps: int = 0
    stop: str = "max_tokens"
    stop_token: int | None = None
    draft_past: int = 0  # tokens in the draft's cache for this sequence


class BatchedDraft:
    """A draft model over N sequences of its own context: each draft position one decode for every sequence
    still drafting."""

    def __init__(self, engine: Engine, drafting: Drafting):
        self.engine, self.drafting = engine, drafting

    def prefill(self, s: Slot) -> None:
        e = self.engine
        e.seq_trim(s.seq, 0)
        prompt = s.req.tokens[:-1]
        for i in range(0, len(prompt), e.cfg.n_batch):
            e.decode_rows([(s.seq, i + j, t, False) for j, t in enumerate(prompt[i:i + e.cfg.n_batch])])
        s.draft_past = len(prompt)

    def propose(self, slots: list[Slot], gammas: list[int], policy: Policy) -> list[Proposal]:
        out = [Proposal() for _ in slots]
        live = [i for i, g in enumerate(gammas) if g > 0]
        # catch up: what each sequence's context holds beyond the draft's cache (the last token, or two)
        rows = [(slots[i].seq, p, slots[i].ctx[p], p == len(slots[i].ctx) - 1)
                for i in live for p in range(slots[i].draft_past, len(slots[i].ctx))]
        for i in live:
            slots[i].draft_past = len(slots[i].ctx)
        logits = self.engine.decode_rows(rows) if rows else None
        for step in range(max(gammas, default=0)):
            if not live:
                break
            nxt, feed = [], []
            for r, i in enumerate(live):
                picked = draft_pick(logits[r], policy, self.drafting, slots[i].draft_rng)
                if picked is None:
                    continue
                out[i].tokens.append(picked[0])
                out[i].q.append(picked[1])
                if step + 1 < gammas[i]:
                    nxt.append(i)
                    feed.append((slots[i].seq, slots[i].draft_past, picked[0], True))
                    slots[i].draft_past += 1
            live = nxt
            logits = self.engine.decode_rows(feed) if feed else None
        n_min = self.drafting.n_min
        return [p if len(p.tokens) >= n_min else Proposal() for p in out]

    def accepted(self, s: Slot) -> None:
        keep = min(s.draft_past, len(s.ctx) - 1)
        self.engine.seq_trim(s.seq, keep)
        s.draft_past = keep


def _prefill_target(target: Engine, s: Slot) -> None:
    target.seq_trim(s.seq, 0)
    prompt = s.req.tokens[:-1]
    nb = target.cfg.n_batch
    for i in range(0, len(prompt), nb):
        target.decode_rows([(s.seq, i + j, t, False) for j, t in enumerate(prompt[i:i + nb])])


def generate_concurrent(target: Engine, requests: list[Request], policy: Policy, n_parallel: int, proposer=None,
                        gamma: int = 0, trace: TraceWriter | None = None, mode: str | None = None,
                        rule: str = "leviathan") -> dict:
    """Every request through n_parallel slots of target's context (cfg.n_seq >= n_parallel), in order. proposer:
    None (plain decoding), a BatchedDraft, or an NgramProposer (it looks each sequence up on its own). Returns
    the batch record."""
    mode = mode or ("baseline" if proposer is None else "speculative")
    trace = trace or TraceWriter(None)
    eog = target.vocab.is_eog
    queue, free, active = list(requests), list(range(n_parallel)), []
    target.reset()
    if isinstance(proposer, BatchedDraft):
        proposer.engine.reset()
    target.perf_reset()
    t_start = time.perf_counter()
    step = tokens = peak = 0
    instr_total = prefill_ms = 0.0
    busy = []  # active sequences per step
    while queue or active:
        while queue and free:  # a free slot takes the next request: its prompt, then it joins the next step
            req, t0 = queue.pop(0), time.perf_counter()
            # the request's streams, not the slot's: it may take another slot in its plain twin's batch
            s = Slot(free.pop(0), req, *streams(policy, req), t0, 0.0, ctx=list(req.tokens))
            _prefill_target(target, s)
            if isinstance(proposer, BatchedDraft):
                proposer.prefill(s)
            s.prefill_ms = (time.perf_counter() - t0) * 1e3
            prefill_ms += s.prefill_ms
            active.append(s)
        s0 = time.perf_counter()
        gammas = [0 if proposer is None else min(gamma, s.req.max_tokens - len(s.out) - 1) for s in active]
        if isinstance(proposer, BatchedDraft):
            props = proposer.propose(active, gammas, policy)
        elif isinstance(proposer, NgramProposer):
            props = [proposer.propose(s.ctx, g) if g > 0 else Proposal() for s, g in zip(active, gammas)]
        else:
            props = [Proposal() for _ in active]
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
            verdict = check(block, p, policy, s.rng, rule)
            i0 = time.perf_counter()
            conf = [top_prob(row) for row in block]
            margin = top2_margin(block[0]) if not p.tokens and mode == "baseline" and policy.greedy else None
            instr += time.perf_counter() - i0
            o = outcome(verdict, p, eog, s.req.max_tokens - len(s.out))
            s.ctx += o.new
            s.out += o.new
            s.from_draft += o.src
            target.seq_trim(s.seq, len(s.ctx) - 1)
            if o.stop_token is not None:
                s.stop, s.stop_token = "eos", o.stop_token
            elif isinstance(proposer, BatchedDraft):
                proposer.accepted(s)
            rec = {"type": "step", "step": s.steps, "batch_step": step, "seq": s.seq, "active": len(active),
                   "batch": len(rows), "gamma": g, "proposed": len(p.tokens),
                   "accepted": o.accepted, "accepted_raw": verdict.accepted, "rejected_at": o.rejected_at,
                   "token": verdict.token, "emitted": len(o.new), "alpha": [round(a, 6) for a in verdict.alpha],
                   "target_conf": [round(c, 6) for c in conf], "prompt_id": s.req.prompt_id,
                   "category": s.req.category}
            if margin is not None:
                rec["margin"] = round(margin, 5)
            recs.append(rec)
            s.steps += 1
            if s.stop == "eos" or len(s.out) >= s.req.max_tokens:
                done.append(s)
        s3 = time.perf_counter()
        instr_total += instr
        step_ms = {"draft_ms": (s1 - s0) * 1e3, "verify_ms": (s2 - s1) * 1e3,
                   "overhead_ms": (s3 - s2 - instr) * 1e3}
        for rec, s in zip(recs, active):
            s.gen_ms += sum(step_ms.values())
            trace.write(rec | step_ms)
        busy.append(len(active))
        step += 1
        for s in done:
            active.remove(s)
            free.append(s.seq)
            tokens += len(s.out)
            trace.write(_generation(target, s, mode, n_parallel))
    wall_ms = (time.perf_counter() - t_start - instr_total) * 1e3
    perf = target.perf()
    rec = {"type": "batch", "mode": mode, "parallel": n_parallel, "requests": len(requests),
           "slots_used": min(n_parallel, len(requests)), "tokens": tokens, "steps": step, "wall_ms": wall_ms,
           "prefill_ms": prefill_ms, "decode_ms": wall_ms - prefill_ms,
           "tokens_per_s": tokens / (wall_ms - prefill_ms) * 1e3 if wall_ms > prefill_ms else 0.0,
           "mean_active": float(np.mean(busy)) if busy else 0.0, "peak_positions": peak,
           "llama_eval_ms": perf["eval_ms"], "llama_n_eval": perf["n_eval"]}
    trace.write(rec)
    return rec


def _generation(target: Engine, s: Slot, mode: str, n_parallel: int) -> dict:
    latency = (time.perf_counter() - s.t_enter) * 1e3
    return {"type": "generation", "mode": mode, "prompt_id": s.req.prompt_id, "category": s.req.category,
            "prompt_tokens": len(s.req.tokens), "n_tokens": len(s.out), "tokens": s.out,
            "from_draft": "".join("d" if x else "t" for x in s.from_draft), "text": target.vocab.detokenize(s.out),
            "stop": s.stop, "stop_token": s.stop_token, "steps": s.steps, "prompt_eval_ms": s.prefill_ms,
            "draft_prefill_ms": 0.0, "gen_ms": s.gen_ms, "latency_ms": latency, "seq": s.seq,
            "parallel": n_parallel, "tokens_per_s": len(s.out) / s.gen_ms * 1e3 if s.gen_ms > 0 else 0.0}
