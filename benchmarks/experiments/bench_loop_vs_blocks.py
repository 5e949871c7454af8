"""Do the loop's decodes cost what calibrate.time_blocks says they cost? (prints figures; not a test). Run alone.

The replay prices every step from blocks timed on their own (time_blocks: the target alone, k = 1..k_max in
turn). The loop decodes in another rhythm: at gamma 1 the target's verification of 2 tokens follows the draft's
decode, in another context with its own threads. In rounds, so that the machine's drift lands on every part:
time_blocks as the replay runs it; time_blocks with one draft decode before each target decode (the loop's
rhythm); the plain loop; the loop at gamma 1 with the draft and with an n-gram lookup. Medians per part, ms."""
from __future__ import annotations

import argparse
import statistics
import time

from harness.calibrate import time_blocks
from harness.engine import EngineConfig


def interleaved(target, draft, n_keep: int, block: list[int], k_max: int, reps: int) -> list[float]:
    """time_blocks with one draft decode (last logits) before each target decode, as the loop alternates them."""
    times: list[list[float]] = [[] for _ in range(k_max)]
    nd = draft.n_past
    for _ in range(reps):
        for k in range(1, k_max + 1):
            target.trim(n_keep)
            draft.trim(nd)
            draft.decode(block[:1], logits="last")
            t = time.perf_counter()
            target.decode(block[:k], logits="all")
            times[k - 1].append((time.perf_counter() - t) * 1000)
    target.trim(n_keep)
    draft.trim(nd)
    return [statistics.median(x) for x in times]


def loop_ms(target, proposer, gamma: int, req) -> dict:
    """Median verification and draft ms per step of one generation (steps that proposed gamma; first dropped)."""
    from harness.loop import generate
    from harness.sampling import Policy
    from harness.trace import TraceWriter
    tw = TraceWriter(None, keep=True)
    generate(target, req, Policy(), proposer, gamma, tw)
    steps = [r for r in tw.records if r["type"] == "step"][1:]
    sel = [r for r in steps if r["proposed"] == gamma] or steps
    return {"verify": statistics.median(r["verify_ms"] for r in sel),
            "draft": statistics.median(r["draft_ms"] for r in sel), "steps": len(sel)}


def main() -> None:
    from harness.engine import Engine
    from harness.loop import Request
    from harness.models.catalog import resolve
    from harness.prompts import load
    from harness.proposers import DraftModelProposer, NgramProposer
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_0")
    ap.add_argument("--category", default="code")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="0: the engine's default")
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=4096, threads=a.threads)
    with Engine(resolve(a.model).path, cfg) as target, Engine(resolve(a.draft).path, cfg) as draft:
        proposer = DraftModelProposer(draft)
        pr = load([a.category])[0]
        toks = target.vocab.tokenize(pr.render(target.vocab))
        req = Request(pr.id, toks, a.max_tokens, pr.category)
        ctx = len(toks) - 4
        block = toks[ctx:ctx + 3]
        rows = []
        for r in range(a.rounds):
            target.reset()
            draft.reset()
            target.decode(toks[:ctx], logits="none")
            draft.decode(toks[:ctx], logits="none")
            iso = time_blocks(target, ctx, block, 3, a.reps, "all")[0]
            mixed = interleaved(target, draft, ctx, block, 3, a.reps)
            target.reset()
            draft.reset()
            plain = loop_ms(target, None, 0, req)
            spec = loop_ms(target, proposer, 1, req)
            ngram = loop_ms(target, NgramProposer(3), 1, req)
            rows.append([iso[0], iso[1], mixed[0], mixed[1], plain["verify"], spec["verify"], spec["draft"],
                         ngram["verify"]])
            print(f"round {r}: " + " ".join(f"{x:6.1f}" for x in rows[-1]), flush=True)
        med = [statistics.median(c) for c in zip(*rows)]
        print(f"\n{a.model}, {cfg.resolved_threads()} threads, {len(toks)}-token {a.category} prompt, {a.max_tokens} "
              f"tokens, greedy; median ms over {a.rounds} rounds")
        names = ["time_blocks k=1", "time_blocks k=2", "with a draft decode before: k=1", "k=2",
                 "plain loop, per step", "gamma 1 + draft: verification", "gamma 1 + draft: draft",
                 "gamma 1 + ngram:3: verification"]
        for n, m in zip(names, med):
            print(f"{n:34s} {m:7.1f}")
        print(f"loop verification / time_blocks k=2: draft {med[5] / med[1]:.3f}, ngram {med[7] / med[1]:.3f}; "
              f"plain loop / time_blocks k=1: {med[4] / med[0]:.3f}; interleaved k=2 / time_blocks k=2: "
              f"{med[3] / med[1]:.3f}")


if __name__ == "__main__":
    main()
