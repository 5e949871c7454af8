"""Engine figures on the default pair (prints figures; not a test). Run alone: `make bench-engine`.

- plain-loop tokens/s against llama.cpp's own decode speed in the same run (llama_perf_context: time inside
  llama_decode), target >= 0.97x;
- speculative tokens/s at gamma 1..4 (greedy), Python overhead per step (target <= 2% of a step);
- stochastic verification ms per position at the target's vocabulary with top-p 0.9 (target <= 0.5 ms).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.models.catalog import resolve
from harness.proposers import DraftModelProposer
from harness.sampling import Policy, process
from harness.trace import TraceWriter
from harness.verify import verify_stochastic

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=1024, threads=a.threads)
    with Engine(resolve(a.target).path, cfg) as t, Engine(resolve(a.draft).path, cfg) as d:
        toks = t.vocab.tokenize(t.vocab.apply_chat_template([{"role": "user", "content": PROMPT}]))
        req = Request("bench", toks, a.tokens)
        generate(t, Request("warm", toks, 4), Policy())  # warm caches
        print(f"target {a.target}, draft {a.draft}, {cfg.resolved_threads()} threads, {a.tokens} tokens, greedy")
        ratios = []
        for _ in range(3):
            g = generate(t, req, Policy())
            own = g["llama_n_eval"] / g["llama_eval_ms"] * 1000
            ratios.append(g["tokens_per_s"] / own)
            print(f"  plain loop {g['tokens_per_s']:.1f} tok/s; llama.cpp inside decode {own:.1f} tok/s; "
                  f"ratio {ratios[-1]:.3f}")
        base = g["tokens_per_s"]
        print(f"plain loop / llama.cpp decode: median {statistics.median(ratios):.3f}x (target >= 0.97)")
        prop = DraftModelProposer(d)
        for gamma in (1, 2, 3, 4):
            tw = TraceWriter(None, keep=True)
            s = generate(t, req, Policy(), prop, gamma, tw)
            steps = [r for r in tw.records if r["type"] == "step"]
            step_ms = sum(r["draft_ms"] + r["verify_ms"] + r["overhead_ms"] for r in steps)
            over = sum(r["overhead_ms"] for r in steps)
            acc = sum(r["accepted"] for r in steps) / max(1, sum(r["proposed"] for r in steps))
            print(f"  speculative gamma={gamma}: {s['tokens_per_s']:.1f} tok/s "
                  f"({s['tokens_per_s'] / base:.2f}x plain), "
                  f"acceptance {acc:.0%}, overhead {over / len(steps):.2f} ms/step = {over / step_ms:.2%} of step time")
        # stochastic verification cost per position on real target logits
        t.reset()
        t.decode(toks[:-1], logits="none")
        rows = np.array(t.decode(toks[-1:] + [toks[0]] * 4, logits="all"))
    pol = Policy(temperature=0.8, top_p=0.9, seed=1)
    rng = np.random.default_rng(0)
    qrows = rows + rng.normal(0, 0.5, rows.shape).astype(np.float32)
    q = [process(r, pol) for r in qrows[:4]]  # the draft's side, not part of verification
    draft = np.array([x.sample(rng) for x in q])
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        p = [process(r, pol) for r in rows]
        verify_stochastic(draft, q, p, rng)
    per_pos = (time.perf_counter() - t0) / n / 4 * 1000
    print(f"stochastic verification (process p and q, accept/reject, alpha) at vocab {rows.shape[1]}, top-p 0.9: "
          f"{per_pos:.3f} ms per position (target <= 0.5)")


if __name__ == "__main__":
    main()
