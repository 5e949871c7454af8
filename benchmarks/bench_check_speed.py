"""Times harness.align.check_pair (vocab-only loads of both GGUFs, full id-by-id comparison, round trip on
the built-in probes) on the default Qwen2.5-Coder pair and the SmolLM2 pair. Prints figures; not a test.

    .venv/bin/python benchmarks/bench_check_speed.py [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import align
from harness.llamacpp import llama

ROOT = Path(__file__).resolve().parents[1]

PAIRS = {
    "qwen2.5-coder 1.5b / 0.5b": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    "smollm2-135m q4_1 / q2_k": ("smollm2-135m-instruct-q4_1.gguf", "smollm2-135m-instruct-q2_k.gguf"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models-dir", type=Path, default=ROOT / "models")
    args = ap.parse_args()
    t0 = time.perf_counter()
    llama()  # import + backend init, outside the timed runs
    print(f"llama_cpp import + backend init: {time.perf_counter() - t0:.3f} s")
    for label, (t, d) in PAIRS.items():
        target, draft = args.models_dir / t, args.models_dir / d
        missing = [p.name for p in (target, draft) if not p.exists()]
        if missing:
            print(f"{label:28s} skipped: {', '.join(missing)} not present")
            continue
        times, verdict = [], ""
        for _ in range(args.runs):
            s = time.perf_counter()
            r = align.check_pair(target, draft)
            times.append(time.perf_counter() - s)
            verdict = r["verdict"]
        print(f"{label:28s} n_vocab {r['target']['n_vocab']:>7}  median {statistics.median(times):.3f} s  "
              f"(runs: {', '.join(f'{x:.3f}' for x in times)})  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
