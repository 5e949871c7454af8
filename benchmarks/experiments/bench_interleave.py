"""Does a block cost what it costs timed alone when the two models take turns? (prints figures; not a test). Run
alone.

The replay's costs (calibrate.in_situ) time the target's blocks back to back, then the draft's; the loop runs them
in turn: gamma draft decodes, one verification, gamma draft decodes. On an Intel Xeon VM the replay priced the
greedy draft-model rows 12% dear in both parts (run 20261203-091450-vm) while its plain and n-gram rows, where
the target decodes alone, agreed. Each block is timed here both ways, the orders alternating in rounds so that a
slow spell of the machine lands on both."""
from __future__ import annotations

import argparse
import statistics
import time

from harness.calibrate import block_times
from harness.engine import Engine, EngineConfig
from harness.models.catalog import resolve

TEXT = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n" * 30


def timed(e: Engine, n_keep: int, tokens: list[int], logits: str) -> float:
    e.trim(n_keep)
    t = time.perf_counter()
    e.decode(tokens, logits=logits)
    return (time.perf_counter() - t) * 1000


def in_turn(target: Engine, draft: Engine, context: int, block: list[int], gamma: int, reps: int) -> dict:
    """ms of the loop's shapes in the loop's order: the draft's gamma single decodes (after catching up on 2
    tokens), then the target's block of gamma + 1; each repetition rolls both back."""
    out: dict[str, list[float]] = {"draft_catch_up_2": [], "draft_1": [], "target": []}
    for _ in range(reps):
        out["draft_catch_up_2"].append(timed(draft, context, block[:2], "last"))
        for j in range(1, gamma):
            t = time.perf_counter()
            draft.decode(block[1 + j:2 + j], logits="last")
            out["draft_1"].append((time.perf_counter() - t) * 1000)
        out["target"].append(timed(target, context, block[:gamma + 1], "all"))
    return {k: statistics.median(v) for k, v in out.items() if v}


def alone(target: Engine, draft: Engine, context: int, block: list[int], gamma: int, reps: int) -> dict:
    """The same shapes as calibrate.in_situ times them: the target's blocks k = 1..gamma + 1 cycled, back to back,
    then the draft's."""
    t = [statistics.median(x) for x in block_times(target, context, block, gamma + 1, reps, "all")]
    d = [statistics.median(x) for x in block_times(draft, context, block, 2, reps, "last")]
    return {"draft_catch_up_2": d[1], "draft_1": d[0], "target": t[gamma]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_0")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--gammas", default="1,3")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    gammas = [int(g) for g in a.gammas.split(",")]
    cfg = EngineConfig(n_ctx=a.context + 64)
    with Engine(resolve(a.target).path, cfg) as target, Engine(resolve(a.draft).path, cfg) as draft:
        text = target.vocab.tokenize(TEXT)
        for e in (target, draft):
            e.decode(text[:a.context], logits="none")
        block = text[a.context:a.context + max(gammas) + 2]
        res: dict = {}
        for g in gammas:
            alone(target, draft, a.context, block, g, 1)  # warm-up
            for _ in range(a.rounds):
                for how, f in (("alone", alone), ("in turn", in_turn)):
                    for k, v in f(target, draft, a.context, block, g, a.reps).items():
                        res.setdefault((g, k, how), []).append(v)
    print(f"{a.target} + {a.draft}, {a.context} cached tokens; median ms of {a.reps} decodes, median of "
          f"{a.rounds} rounds (the two orders alternating)")
    print(f"{'gamma':>5s} {'block':18s} {'alone':>8s} {'in turn':>8s} {'ratio':>6s}")
    for g in gammas:
        for k in ("target", "draft_1", "draft_catch_up_2"):
            if (g, k, "in turn") not in res:
                continue
            x, y = statistics.median(res[(g, k, "alone")]), statistics.median(res[(g, k, "in turn")])
            name = f"target k={g + 1}" if k == "target" else k.replace("_", " ")
            print(f"{g:5d} {name:18s} {x:8.1f} {y:8.1f} {y / x:6.3f}")


if __name__ == "__main__":
    main()
