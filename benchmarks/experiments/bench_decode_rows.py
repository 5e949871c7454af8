"""Where the slots loop's 5% at one slot goes (issue 44, item 3): Engine.decode against Engine.decode_rows on one
sequence, for one token and for a verification block, interleaved in alternating order on the same context; then
each loop's own Python per generated token (its steps' time less the time inside llama_decode), from a profile of
both loops on the same prompts. Prints figures; run alone on a quiet machine.

    .venv/bin/python benchmarks/experiments/bench_decode_rows.py   # the default pair
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from harness.concurrency.loop import BatchedDraft, generate_concurrent
from harness.drafting import Drafting
from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.models.catalog import resolve
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.trace import TraceWriter

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
        t.seq_trim(0, base)  # decode_rows leaves n_past alone: its rows leave the KV by sequence
        t.n_past = base
    for r in range(reps):
        for how in (("decode", "decode_rows") if r % 2 == 0 else ("decode_rows", "decode")):
            one(how)
    return statistics.median(ms["decode"]), statistics.median(ms["decode_rows"])


def in_decode_ms(prof: cProfile.Profile) -> tuple[float, float]:
    """(total ms, ms inside Engine.decode and Engine.decode_rows: llama_decode and the batch's filling) of a
    profile (a ctypes call is not a function of its own to the profiler)."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values()) * 1e3  # tottime summed: the whole run
    dec = sum(v[3] for k, v in st.stats.items() if k[0].endswith("engine.py") and k[2] in ("decode", "decode_rows"))
    return total, dec * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40)
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=1024)
    with Engine(resolve(a.target).path, cfg) as t, Engine(resolve(a.draft).path, cfg) as d:
        prompt = t.vocab.tokenize(t.vocab.apply_chat_template([{"role": "user", "content": PROMPT}]))
        print(f"target {a.target}, draft {a.draft}, {cfg.resolved_threads()} threads")
        for block in (1, a.gamma + 1):
            dec, rows = ab_decode(t, prompt, block, a.reps)
            print(f"  a block of {block}: decode {dec:.2f} ms, decode_rows {rows:.2f} ms, ratio {rows / dec:.3f} "
                  f"({a.reps} each, interleaved)")
        req = Request("p", prompt, a.tokens)
        loops = {"sequential": lambda: generate(t, req, Policy(), DraftModelProposer(d), a.gamma),
                 "slots": lambda: generate_concurrent(t, [req], Policy(), 1, BatchedDraft(d, Drafting()), a.gamma,
                                                      TraceWriter(None, keep=True))}
        for f in loops.values():  # warm both
            f()
        out = {k: [] for k in loops}
        for r in range(4):
            for name in (list(loops) if r % 2 == 0 else list(loops)[::-1]):
                prof = cProfile.Profile()
                prof.enable()
                loops[name]()
                prof.disable()
                out[name].append(in_decode_ms(prof))
        for name, xs in out.items():
            total, dec = (statistics.median(x[i] for x in xs) for i in (0, 1))
            print(f"  {name} loop, gamma {a.gamma}, {a.tokens} tokens (profiled): {total:.0f} ms, in the engine's "
                  f"decodes {dec:.0f} ms, outside it {total - dec:.0f} ms ({(total - dec) / a.tokens:.2f} ms a token)")


if __name__ == "__main__":
    main()
