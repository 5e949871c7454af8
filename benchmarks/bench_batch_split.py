"""What one llama_decode of several sequences costs when their blocks are equal and when one is a token short
(prints figures; not a test). Run alone: `make bench-engine`.

With a KV buffer per sequence (llama-server's explicit -np, and harness bench --parallel), llama.cpp splits a
batch into equal shares of its sequences: a batch where one sequence's block is shorter runs as two graphs. With
one unified buffer (-kvu) it does not, and each token attends over every cell in use instead. With --model set
to a draft: what its catch-up (two tokens in the sequences whose drafts were all accepted) costs, against one
token each."""
from __future__ import annotations

import argparse
import statistics
import time

from harness.engine import Engine, EngineConfig
from harness.models.catalog import resolve

TEXT = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n" * 30


def timed(e: Engine, text: list[int], context: int, shapes: list[list[int]], reps: int) -> list[float]:
    """Median ms of one decode per shape, the shapes interleaved within each repetition (a slow spell of the
    machine lands on all of them)."""
    times: list[list[float]] = [[] for _ in shapes]
    for _ in range(reps):
        for k, sizes in enumerate(shapes):
            rows = [(s, context + i, text[context + i], True) for s, n in enumerate(sizes) for i in range(n)]
            t0 = time.perf_counter()
            e.decode_rows(rows)
            times[k].append((time.perf_counter() - t0) * 1e3)
            for s in range(len(sizes)):
                e.seq_trim(s, context)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    n = a.sequences
    shapes = {"plain, one token each": [1] * n, "one sequence 2 tokens (a draft catching up)": [1] * (n - 1) + [2],
              "verify, blocks of 4": [4] * n, "one block of 3 (a request near its end)": [4] * (n - 1) + [3],
              "two tokens each": [2] * n, "every other sequence 2 tokens": [2, 1] * (n // 2) + [2] * (n % 2)}
    print(f"{a.model}, {n} sequences of {a.context} cached tokens; median ms of {a.reps} decodes")
    print(f"{'batch':46s} {'per-sequence KV':>16s} {'unified KV':>11s}")
    res = {}
    for unified in (False, True):
        e = Engine(resolve(a.model).path, EngineConfig(n_ctx=4096, n_seq=n, kv_unified=unified))
        text = e.vocab.tokenize(TEXT)
        for s in range(n):
            e.decode_rows([(s, i, t, False) for i, t in enumerate(text[:a.context])])
        timed(e, text, a.context, list(shapes.values()), 1)  # warm-up: page the weights in, size the buffers
        for name, x in zip(shapes, timed(e, text, a.context, list(shapes.values()), a.reps)):
            res[(name, unified)] = x
        e.close()
    for name in shapes:
        print(f"{name:46s} {res[(name, False)]:14.1f}ms {res[(name, True)]:9.1f}ms")


if __name__ == "__main__":
    main()
