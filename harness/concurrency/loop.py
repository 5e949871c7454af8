"""Several requests decoded together, as llama-server's slots do: N sequences in one context, one llama_decode per
step holding every active sequence's token (plain) or verification block (speculative), the draft batched the
same way. A sequence that finishes frees its slot for the next request, so the batch stays full until the
requests run out. Each sequence keeps its own positions, KV range (rolled back on its own) and random streams
(its request's, as the single-sequence loop's): each sequence's step after the decode is loop.advance, the
single-sequence loop's, so outputs stay lossless and the step records the same.

Trace records: a step record per sequence and step (the step's shared draft, verify and overhead times; `batch`
tokens the target decoded in it, `active` sequences), a generation record per request (gen_ms: the steps it took
part in; latency_ms: from entering its slot to its last token), and one "batch" record per call."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from harness.drafting import Drafting, Proposal
from harness.engine import Engine
from harness.gamma import gamma_cap
from harness.loop import Request, Seq, advance, streams
from harness.proposers import DraftKV, NgramProposer
from harness.sampling import Policy
from harness.trace import TraceWriter


@dataclass(kw_only=True)
class Slot(Seq):
    seq: int
    req: Request
    draft_rng: np.random.Generator
    t_enter: float
    prefill_ms: float = 0.0
    gen_ms: float = 0.0
    draft: DraftKV = field(default_factory=DraftKV)  # the draft's cache of this sequence


def _prefill(engine: Engine, s: Slot) -> None:
    """The request's prompt, all but its last token, into s's sequence of engine (the target's or the draft's)."""
    engine.seq_trim(s.seq, 0)
    prompt, nb = s.req.tokens[:-1], engine.cfg.n_batch
    for i in range(0, len(prompt), nb):
        engine.decode_rows([(s.seq, i + j, t, False) for j, t in enumerate(prompt[i:i + nb])])


class BatchedDraft:
    """A draft model over N sequences of its own context: each draft position one decode for every sequence
    still drafting."""

    def __init__(self, engine: Engine, drafting: Drafting):
        self.engine, self.drafting = engine, drafting

    def prefill(self, s: Slot) -> None:
        _prefill(self.engine, s)
        s.draft = DraftKV(len(s.req.tokens) - 1)

    def propose(self, slots: list[Slot], gammas: list[int], policy: Policy) -> list[Proposal]:
        out = [Proposal() for _ in slots]
        live = [i for i, g in enumerate(gammas) if g > 0]
        rows = []
        for i in live:
            s = slots[i]
            at = s.draft.past
            behind = s.draft.catch_up(s.ctx)
            rows += [(s.seq, at + j, t, j == len(behind) - 1) for j, t in enumerate(behind)]
        logits = self.engine.decode_rows(rows) if rows else None
        while live:
            nxt, feed = [], []
            for r, i in enumerate(live):
                s = slots[i]
                if s.draft.pick(out[i], logits[r], policy, self.drafting, s.draft_rng, gammas[i]):
                    nxt.append(i)
                    feed.append((s.seq, s.draft.past - 1, out[i].tokens[-1], True))
            live = nxt
            logits = self.engine.decode_rows(feed) if feed else None
        return [self.drafting.kept(p) for p in out]

    def accepted(self, s: Slot) -> None:
        self.engine.seq_trim(s.seq, s.draft.accepted(s.ctx))


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
            rng, draft_rng = streams(policy, req)
            s = Slot(list(req.tokens), rng, seq=free.pop(0), req=req, draft_rng=draft_rng, t_enter=t0)
            _prefill(target, s)
            if isinstance(proposer, BatchedDraft):
                proposer.prefill(s)
            s.prefill_ms = (time.perf_counter() - t0) * 1e3
            prefill_ms += s.prefill_ms
            active.append(s)
        s0 = time.perf_counter()
        gammas = [0 if proposer is None else gamma_cap(gamma, s.req.max_tokens - len(s.out)) for s in active]
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
            a = advance(s, block, p, g, policy, rule, eog, s.req.max_tokens, mode == "baseline",
                        partial(target.seq_trim, s.seq))
            instr += a.instr_s
            if s.stop != "eos" and isinstance(proposer, BatchedDraft):
                proposer.accepted(s)
            recs.append(a.rec | {"batch_step": step, "seq": s.seq, "active": len(active), "batch": len(rows),
                                 "prompt_id": s.req.prompt_id, "category": s.req.category})
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
