"""How far does the batched calibration move by itself? (prints figures; not a test). Run alone.

A batched run prices each configuration's steps from one calibration (concurrency.calibrate.batched_costs, three
repetitions at context 128) taken when its worker starts. This takes it --repeats times in one process, then times
each shape steady (the same shape --reps times in a row, the first dropped) at several contexts: if the
calibrations spread as widely as the prices miss, the misses are the machine's pace, not the model's shape."""
from __future__ import annotations

import argparse

from harness.concurrency.calibrate import _prefill, _time, batched_costs, sequence_counts
from harness.engine import Engine, EngineConfig
from harness.pair import open_pair

TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def steady(e: Engine, ctx: int, block: list[int], counts: list[int], reps: int) -> list[float]:
    """Median ms of m sequences x block, each shape decoded reps + 1 times in a row, the first dropped."""
    out = []
    for m in counts:
        _time(e, ctx, block, [m], 1)
        out += _time(e, ctx, block, [m], reps)
    return out


def spread(xs: list[float]) -> str:
    return f"{min(xs):.0f}-{max(xs):.0f} ({max(xs) / min(xs) - 1:.0%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--kv-unified", action="store_true")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--contexts", default="32,128,384")
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=4096, n_seq=a.parallel, kv_unified=a.kv_unified)
    pair = open_pair(a.target, a.draft, cfg)
    t, d = pair.target, pair.draft_engine
    text = t.vocab.tokenize(TEXT * 40, add_special=False)
    counts = sequence_counts(a.parallel)
    runs = [batched_costs(t, d, text, a.parallel, a.gamma) for _ in range(a.repeats)]
    print(f"batched_costs x{a.repeats} in one process (N = {counts}, unified KV: {a.kv_unified}); ms, lowest-highest:")
    for key in ("plain_ms", "verify_ms", "draft_ms", "draft_catch_up_ms"):
        print(f"  {key:18s} " + "  ".join(f"{m}: {spread([r[key][i] for r in runs])}" for i, m in enumerate(counts)))
    print(f"the target steady, each shape {a.reps} times in a row (first dropped), twice per context:")
    for ctx in (int(c) for c in a.contexts.split(",")):
        got = []
        for _ in range(2):
            _prefill(t, text[:ctx], a.parallel)
            got.append((steady(t, ctx, text[ctx:ctx + 1], counts, a.reps),
                        steady(t, ctx, text[ctx:ctx + a.gamma + 1], counts, a.reps)))
        for name, i in (("plain", 0), (f"block {a.gamma + 1}", 1)):
            print(f"  context {ctx:4d} {name:8s} " + "  ".join(
                f"{m}: {spread([g[i][j] for g in got])}" for j, m in enumerate(counts)))
    pair.close()


if __name__ == "__main__":
    main()
