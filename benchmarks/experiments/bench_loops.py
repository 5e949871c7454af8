"""The sequential loop against the slots loop with one slot (prints figures; not a test). Both run the same prompts
on the same engines, plain and speculative (greedy, a draft model at a fixed gamma), interleaved and in
alternating order, so drift in the machine's speed falls on both alike. Per mode: the median ms per generated
token of each loop and their ratio (slots / sequential). Whether `generate` could be `generate_concurrent` with one
slot rests on that ratio staying at 1.00 (the plain loop runs at 1.04-1.06x llama-bench): run it on a quiet
machine.

    .venv/bin/python benchmarks/experiments/bench_loops.py   # the default pair; --target/--draft for others
"""
from __future__ import annotations

import argparse
import statistics

from harness.concurrency.loop import BatchedDraft, generate_concurrent
from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.models.catalog import resolve
from harness.drafting import Drafting
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.trace import TraceWriter

PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests.",
    "Explain what a context manager is in Python and write one that times a block of code.",
    "Implement binary search over a sorted list in Python, returning the insertion point when absent.",
    "Write a shell script that finds the ten largest files under a directory and prints their sizes.",
]


def run(loop: str, target: Engine, req: Request, proposer, gamma: int) -> dict:
    """One generation through `loop`; its generation record (gen_ms: its steps, prompt excluded)."""
    if loop == "sequential":
        return generate(target, req, Policy(), proposer, gamma)
    tw = TraceWriter(None, keep=True)
    generate_concurrent(target, [req], Policy(), 1, proposer, gamma, tw)
    return next(r for r in tw.records if r["type"] == "generation")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=1024, threads=a.threads)
    with Engine(resolve(a.target).path, cfg) as t, Engine(resolve(a.draft).path, cfg) as d:
        reqs = [Request(f"p{i}", t.vocab.tokenize(t.vocab.apply_chat_template([{"role": "user", "content": p}])),
                        a.tokens) for i, p in enumerate(PROMPTS)]
        proposers = {"sequential": DraftModelProposer(d), "slots": BatchedDraft(d, Drafting())}
        modes = {"plain": 0, f"speculative gamma={a.gamma}": a.gamma}
        for loop in proposers:  # warm caches, both loops
            run(loop, t, Request("warm", reqs[0].tokens, 4), proposers[loop], a.gamma)
        print(f"target {a.target}, draft {a.draft}, {cfg.resolved_threads()} threads, {len(reqs)} prompts x "
              f"{a.tokens} tokens x {a.rounds} rounds, greedy")
        ms = {(m, loop): [] for m in modes for loop in proposers}
        differ = 0
        for r in range(a.rounds):
            for i, req in enumerate(reqs):
                for mode, gamma in modes.items():
                    order = list(proposers) if (r + i) % 2 == 0 else list(proposers)[::-1]
                    gens = {loop: run(loop, t, req, proposers[loop] if gamma else None, gamma) for loop in order}
                    for loop, g in gens.items():
                        ms[mode, loop].append(g["gen_ms"] / max(1, g["n_tokens"]))
                    differ += gens["sequential"]["tokens"] != gens["slots"]["tokens"]
        for mode in modes:
            seq, slots = (statistics.median(ms[mode, loop]) for loop in proposers)
            print(f"  {mode}: sequential {seq:.2f} ms/token, slots (n_parallel=1) {slots:.2f} ms/token, "
                  f"ratio {slots / seq:.3f}")
        if differ:
            print(f"  outputs differed in {differ} pairs of generations (kernel near-ties between the two decodes)")


if __name__ == "__main__":
    main()
