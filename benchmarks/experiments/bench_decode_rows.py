"""Whether the batch API costs anything on one sequence (issue 44, item 3, before the two loops became one):
Engine.decode against Engine.decode_rows, for one token and for a verification block, interleaved in alternating
order on the same context. Prints figures; run alone on a quiet machine.

    .venv/bin/python benchmarks/experiments/bench_decode_rows.py   # the default pair
"""
from __future__ import annotations

import argparse
import statistics
import time

from harness.engine import Engine, EngineConfig
from harness.models.catalog import resolve

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests."


def ab_decode(t: Engine, prompt: list[int], block: int, reps: int) -> tuple[float, float]:
    """Median ms of a block of `block` tokens (all logits) through decode and through decode_rows, each from the
    same position after the prompt, alternating which goes first."""
    t.reset()
    t.decode(prompt, logits="last")
    base, toks = t.n_past, prompt[-block:]
    ms = {"decode": [], "decode_rows": []}

    def one(how: str) -> None:
        s = time.perf_counter()
        if how == "decode":
            t.decode(toks, logits="all")
        else:
            t.decode_rows([(0, base + i, tok, True) for i, tok in enumerate(toks)])
        ms[how].append((time.perf_counter() - s) * 1e3)
        t.seq_trim(0, base)
    for r in range(reps):
        for how in (("decode", "decode_rows") if r % 2 == 0 else ("decode_rows", "decode")):
            one(how)
    return statistics.median(ms["decode"]), statistics.median(ms["decode_rows"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40)
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=1024)
    with Engine(resolve(a.target).path, cfg) as t:
        prompt = t.vocab.tokenize(t.vocab.apply_chat_template([{"role": "user", "content": PROMPT}]))
        print(f"target {a.target}, {cfg.resolved_threads()} threads")
        for block in (1, a.gamma + 1):
            dec, rows = ab_decode(t, prompt, block, a.reps)
            print(f"  a block of {block}: decode {dec:.2f} ms, decode_rows {rows:.2f} ms, ratio {rows / dec:.3f} "
                  f"({a.reps} each, interleaved)")


if __name__ == "__main__":
    main()
