"""Does a block cost less when the decode before it had the same shape? (prints figures; not a test). Run alone.

calibrate.time_blocks cycles k = 1..k_max, so no two consecutive decodes share a shape, while the loop at a fixed
gamma decodes the same shape step after step, and llama.cpp reuses the previous compute graph when the shape
repeats (unless LLAMA_GRAPH_REUSE_DISABLE is set). Each k is timed both ways, once with reuse and once in a child
process with it disabled (llama.cpp reads the variable when a context is made). Then the loop itself, plain and
at gamma = k_max - 1 with --draft, both ways: its median verification and draft times per step, and its speed."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from harness.calibrate import time_blocks
from harness.engine import Engine, EngineConfig
from harness.models.catalog import resolve

TEXT = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n" * 30


def repeated(e: Engine, n_keep: int, block: list[int], k_max: int, reps: int, logits: str) -> list[float]:
    """Median ms of decoding block[:k] reps times in a row (the first of each run of k dropped: its graph is new)."""
    out = []
    for k in range(1, k_max + 1):
        times = []
        for _ in range(reps + 1):
            e.trim(n_keep)
            t = time.perf_counter()
            e.decode(block[:k], logits=logits)
            times.append((time.perf_counter() - t) * 1000)
        out.append(statistics.median(times[1:]))
    e.trim(n_keep)
    return out


def loop(model: str, draft: str, gamma: int, max_tokens: int) -> dict:
    """The loop at a fixed gamma, then plain, twice over one prompt: median ms per step of each part, tok/s."""
    from harness.loop import Request, generate
    from harness.prompts import load
    from harness.proposers import DraftModelProposer
    from harness.sampling import Policy
    from harness.trace import TraceWriter
    cfg = EngineConfig(n_ctx=2048)
    with Engine(resolve(model).path, cfg) as target, Engine(resolve(draft).path, cfg) as draft_engine:
        pr = load(["code"])[0]
        req = Request(pr.id, target.vocab.tokenize(pr.render(target.vocab)), max_tokens, pr.category)
        proposer = DraftModelProposer(draft_engine)
        out: dict = {"spec_tok_s": [], "plain_tok_s": [], "verify_ms": [], "draft_ms": [], "plain_step_ms": []}
        for _ in range(2):
            for mode, prop, g in (("spec", proposer, gamma), ("plain", None, 0)):
                tw = TraceWriter(None, keep=True)
                gen = generate(target, req, Policy(), prop, g, tw)
                steps = [r for r in tw.records if r["type"] == "step"][1:]  # the first pays a one-off warm-up
                out[f"{mode}_tok_s"].append(gen["tokens_per_s"])
                if prop:
                    out["verify_ms"] += [r["verify_ms"] for r in steps if r["proposed"] == g]
                    out["draft_ms"] += [r["draft_ms"] for r in steps if r["proposed"] == g][1:]
                else:
                    out["plain_step_ms"] += [r["verify_ms"] for r in steps]
        return {k: statistics.median(v) for k, v in out.items()}


def measure(model: str, context: int, k_max: int, reps: int, logits: str) -> dict:
    with Engine(resolve(model).path, EngineConfig(n_ctx=context + k_max + 8)) as e:
        text = e.vocab.tokenize(TEXT)
        e.decode(text[:context], logits="none")
        block = text[context:context + k_max]
        time_blocks(e, context, block, k_max, 1, logits)  # warm-up
        res = {"cycling": [], "repeated": []}
        for _ in range(3):  # the two orders alternate, so that a slow spell lands on both
            res["cycling"].append(time_blocks(e, context, block, k_max, reps, logits)[0])
            res["repeated"].append(repeated(e, context, block, k_max, reps, logits))
        return {m: [statistics.median(x) for x in zip(*v)] for m, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--k-max", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--logits", default="all", choices=["all", "last"])
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_0", help="the loop's draft ('' skips it)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        res = measure(a.model, a.context, a.k_max, a.reps, a.logits)
        if a.draft:
            res["loop"] = loop(a.model, a.draft, a.k_max - 1, a.max_tokens)
        print(json.dumps(res))
        return
    runs = {}
    for label, env in (("reuse", {}), ("reuse disabled", {"LLAMA_GRAPH_REUSE_DISABLE": "1"})):
        out = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env=os.environ | env,
                             capture_output=True, text=True, check=True).stdout
        runs[label] = json.loads(out.strip().splitlines()[-1])
    print(f"{a.model}, {a.context} cached tokens, logits {a.logits}; median ms of {a.reps} decodes x 3 rounds")
    print(f"{'k':>2s} | {'cycling':>8s} {'repeated':>9s} {'ratio':>6s} | reuse disabled: {'cycling':>8s} "
          f"{'repeated':>9s} {'ratio':>6s}")
    r, d = runs["reuse"], runs["reuse disabled"]
    for i in range(a.k_max):
        print(f"{i + 1:2d} | {r['cycling'][i]:8.1f} {r['repeated'][i]:9.1f} {r['repeated'][i] / r['cycling'][i]:6.3f}"
              f" | {'':15s} {d['cycling'][i]:8.1f} {d['repeated'][i]:9.1f} {d['repeated'][i] / d['cycling'][i]:6.3f}")
    if a.draft:
        print(f"\nthe loop, {a.draft} at gamma {a.k_max - 1}, {a.max_tokens} tokens of a code prompt, greedy "
              "(median per step, first step dropped):")
        for key in ("verify_ms", "draft_ms", "plain_step_ms", "spec_tok_s", "plain_tok_s"):
            print(f"{key:14s} reuse {r['loop'][key]:8.1f}   reuse disabled {d['loop'][key]:8.1f}")


if __name__ == "__main__":
    main()
