"""Does a unified KV buffer make the draft's batched decodes dearer once requests come and go? (prints figures; not
a test). Run alone.

The batched cost model prices a draft decode of N sequences from concurrency.calibrate: N sequences of the same
length, written once, side by side. A real batched run writes, rolls back and frees cells all the time: drafts
rejected, requests finished and replaced. With a KV buffer per sequence each sequence's cells stay its own; with
one unified buffer llama.cpp places new cells wherever it finds room, and attends over every cell up to the last
one in use. In turn for each layout: the calibration's decode, then the same decode timed through a run of
speculative-looking steps with requests replaced, then the calibration's again. With --loop, the batched loop
itself with the target: its draft's time per step, split into the draft's decodes (timed around each call) and
the rest (its picking), against the decodes as the batched model prices them."""
from __future__ import annotations

import argparse
import random
import statistics
import time

from harness.concurrency.calibrate import batched_costs
from harness.engine import Engine, EngineConfig
from harness.models.catalog import resolve


def churn(e: Engine, prompts: list[list[int]], n: int, steps: int, gamma: int, max_tokens: int,
          rng: random.Random) -> list[float]:
    """ms of each decode of n sequences x 1 token during steps that look like the batched loop's: per sequence a
    catch-up of 1-2 tokens, gamma - 1 single tokens, then a rollback of what was rejected; a sequence that has
    max_tokens is freed and the next prompt written in its place."""
    e.reset()
    nxt, pos, made, times = 0, [0] * n, [0] * n, []

    def start(s: int) -> None:
        nonlocal nxt
        p = prompts[nxt % len(prompts)]
        nxt += 1
        e.seq_trim(s, 0)
        for i in range(0, len(p), 64):
            e.decode_rows([(s, i + j, t, False) for j, t in enumerate(p[i:i + 64])])
        pos[s], made[s] = len(p), 0

    for s in range(n):
        start(s)
    for _ in range(steps):
        rows = [(s, pos[s] + i, 1, i == k - 1) for s in range(n) for k in [rng.choice((1, 2))] for i in range(k)]
        e.decode_rows(rows)
        for s in range(n):
            pos[s] = max(r[1] for r in rows if r[0] == s) + 1
        for _ in range(gamma - 1):
            t = time.perf_counter()
            e.decode_rows([(s, pos[s], 1, True) for s in range(n)])
            times.append((time.perf_counter() - t) * 1000)
            pos = [p + 1 for p in pos]
        for s in range(n):
            back = rng.randint(0, gamma)  # drafts rejected
            pos[s] -= back
            e.seq_trim(s, pos[s])
            made[s] += gamma - back + 1
            if made[s] >= max_tokens:
                start(s)
    e.reset()
    return times


def loop(a, unified: bool) -> dict:
    """The batched loop at N = parallel, greedy: per full step (every sequence drafting), the draft's time, its
    decodes' time, and the decodes priced by concurrency.costs from a calibration taken just before."""
    from harness.concurrency.costs import from_record
    from harness.concurrency.costs import batch_ms
    from harness.concurrency.figures import _batched, shaped_prices
    from harness.concurrency.loop import BatchedDraft, generate_concurrent
    from harness.loop import Request
    from harness.pair import open_pair
    from harness.prompts import load
    from harness.drafting import Drafting
    from harness.sampling import Policy
    from harness.trace import TraceWriter
    cfg = EngineConfig(n_ctx=a.n_ctx, n_seq=a.parallel, kv_unified=unified)
    pair = open_pair(a.target, a.model, cfg, cfg)
    try:
        t, d = pair.target, pair.draft_engine
        reqs = [Request(p.id, t.vocab.tokenize(p.render(t.vocab)), a.max_tokens, p.category)
                for p in load(a.categories.split(","))]
        text = [x for r in reqs for x in r.tokens]
        ctx = round(statistics.mean(len(r.tokens) for r in reqs) + a.max_tokens / 2)
        rec = batched_costs(t, d, text, a.parallel, a.gamma, ctx)
        decodes: list[float] = []  # per step, the draft's decodes within its proposing (its prefills apart)
        inner, inside = d.decode_rows, [False]

        def timed(rows):
            t0 = time.perf_counter()
            out = inner(rows)
            if inside[0]:
                decodes[-1] += (time.perf_counter() - t0) * 1000
            return out
        d.decode_rows = timed
        proposer = BatchedDraft(d, Drafting())
        orig = proposer.propose

        def propose(*args):
            decodes.append(0.0)
            inside[0] = True
            try:
                return orig(*args)
            finally:
                inside[0] = False
        proposer.propose = propose
        tw = TraceWriter(None, keep=True)
        generate_concurrent(t, reqs, Policy(), a.parallel, proposer, a.gamma, tw)
        steps = [r for r in tw.records if r["type"] == "step"]
        groups = _batched(steps)
        full = [i for i, g in enumerate(groups) if len(g) == a.parallel and all(s["gamma"] == a.gamma for s in g)]
        costs = from_record(rec, ctx, a.gamma, a.parallel)
        # a step's price less its overhead and its verification: its draft's
        prices = shaped_prices(costs, groups, unified)
        priced = [prices[i] - groups[i][0]["overhead_ms"] - batch_ms(
            costs, [1 + s["proposed"] for s in groups[i]], [s["seq"] for s in groups[i]], unified) for i in full]
        return {"draft": statistics.median(groups[i][0]["draft_ms"] for i in full),
                "decodes": statistics.median(decodes[i] for i in full),
                "priced": statistics.median(priced), "steps": len(full)}
    finally:
        pair.close()


def main() -> None:
    from harness.prompts import load
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=4096, help="cells shared by the sequences (the concurrency profile's)")
    ap.add_argument("--categories", default="code,creative")
    ap.add_argument("--loop", action="store_true", help="the batched loop itself, with --target")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    a = ap.parse_args()
    if a.loop:
        for unified in (False, True):
            r = loop(a, unified)
            print(f"{'unified KV' if unified else 'KV per sequence':16s} {r['steps']} full steps: the draft's time "
                  f"{r['draft']:.1f} ms a step, its decodes {r['decodes']:.1f}, priced {r['priced']:.1f}", flush=True)
        return
    out = {}
    for unified in (False, True):
        cfg = EngineConfig(n_ctx=a.n_ctx, n_seq=a.parallel, kv_unified=unified)
        with Engine(resolve(a.model).path, cfg) as e:
            prompts = [e.vocab.tokenize(p.render(e.vocab)) for p in load(a.categories.split(","))]
            text = [t for p in prompts for t in p]
            ctx = round(statistics.mean(len(p) for p in prompts) + a.max_tokens / 2)
            before = batched_costs(e, None, text, a.parallel, a.gamma, ctx)["plain_ms"][-1]
            during = statistics.median(churn(e, prompts, a.parallel, a.steps, a.gamma, a.max_tokens,
                                             random.Random(0)))
            after = batched_costs(e, None, text, a.parallel, a.gamma, ctx)["plain_ms"][-1]
        out[unified] = (before, during, after)
        print(f"{'unified' if unified else 'per sequence'}: {a.parallel} x 1 token at {ctx} tokens a sequence: "
              f"calibration {before:.1f} ms, during the steps {during:.1f}, calibration again {after:.1f}", flush=True)
    print(f"\n{a.model}, {a.parallel} sequences, {a.categories} prompts, gamma {a.gamma}, {a.max_tokens} tokens a "
          "request; during / mean of the calibrations:")
    for unified, (b, d, f) in out.items():
        print(f"{'unified KV' if unified else 'KV per sequence':16s} {d / ((b + f) / 2):.3f}")


if __name__ == "__main__":
    main()
