"""Issue 44, item 3's constraint, in one sitting: the loop against llama.cpp's own tools, before and after a change.
For each harness tree given (e.g. a worktree of the commit before the change, and this one), in alternating order:
the plain loop's and the speculative loop's tokens/s (the default pair, a code prompt, greedy, gamma 3, 64 tokens),
each the median of --reps generations; between the trees' turns llama-bench tg64 and llama-speculative-simple at
draft-max 3 on the same prompt. Prints each figure and the ratios; run alone on a quiet machine.

    git worktree add /tmp/before 28a238f
    .venv/bin/python benchmarks/experiments/bench_one_loop.py /tmp/before .
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests."
TOKENS, GAMMA = 64, 3

INNER = """
import json, statistics, sys
import harness
from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.models.catalog import resolve
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
target, draft, prompt, tokens, gamma, reps = sys.argv[1:7]
cfg = EngineConfig(n_ctx=1024, threads=2)
with Engine(resolve(target).path, cfg) as t, Engine(resolve(draft).path, cfg) as d:
    req = Request("p", t.vocab.tokenize(t.vocab.apply_chat_template([{"role": "user", "content": prompt}])),
                  int(tokens))
    generate(t, req, Policy(), DraftModelProposer(d), int(gamma))  # warm both models
    plain = [generate(t, req, Policy())["tokens_per_s"] for _ in range(int(reps))]
    spec = [generate(t, req, Policy(), DraftModelProposer(d), int(gamma)) for _ in range(int(reps))]
print(json.dumps({"harness": harness.__file__, "plain": statistics.median(plain),
                  "spec": statistics.median(g["tokens_per_s"] for g in spec),
                  "accept": spec[0]["from_draft"].count("d") / max(1, spec[0]["n_tokens"])}))
"""


def loop_figures(tree: Path, target: str, draft: str, reps: int) -> dict:
    """In the tree's own folder (`python -c` puts it first on the path), with this one's models and catalog."""
    from harness.models.catalog import catalog_path, models_dir
    env = os.environ | {"HARNESS_MODELS_DIR": str(models_dir().resolve()),
                        "HARNESS_CATALOG": str(catalog_path().resolve())}
    out = subprocess.run([sys.executable, "-c", INNER, target, draft, PROMPT, str(TOKENS), str(GAMMA), str(reps)],
                         env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_bench(bin_dir: Path, target: Path) -> float:
    out = subprocess.run([bin_dir / "llama-bench", "-m", target, "-p", "0", "-n", str(TOKENS), "-t", "2", "-r", "5",
                          "-o", "json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["avg_ts"]


def speculative_simple(bin_dir: Path, target: Path, draft: Path, prompt: str) -> tuple[float, float]:
    out = subprocess.run([bin_dir / "llama-speculative-simple", "-m", target, "-md", draft, "-c", "1024", "-t", "2",
                          "-n", str(TOKENS), "--spec-type", "draft-simple", "--spec-draft-n-max", str(GAMMA),
                          "--spec-draft-p-min", "0", "--temp", "0", "-p", prompt], capture_output=True, text=True)
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out.stderr)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", out.stderr)
    if not speed:
        raise SystemExit(f"llama-speculative-simple printed no speed:\n{out.stderr[-2000:]}")
    return float(speed.group(1)), float(accept.group(1)) / 100 if accept else float("nan")


def main() -> None:
    from harness.crosscheck.binary import find
    from harness.engine import Engine, EngineConfig
    from harness.models.catalog import resolve
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    bin_dir = Path(os.environ.get("HARNESS_NATIVE_BIN") or find(None).parent)
    tpath, dpath = resolve(a.target).path, resolve(a.draft).path
    with Engine(tpath, EngineConfig(n_ctx=256)) as t:  # the prompt as the loop sees it, for llama.cpp's tool
        prompt = t.vocab.apply_chat_template([{"role": "user", "content": PROMPT}])
    figs: dict[str, list[dict]] = {str(x): [] for x in a.trees}
    tools = []
    for r in range(a.rounds):
        for tree in (a.trees if r % 2 == 0 else a.trees[::-1]):
            figs[str(tree)].append(loop_figures(tree, a.target, a.draft, a.reps))
            print(f"round {r} {tree}: {figs[str(tree)][-1]}", flush=True)
        tools.append((llama_bench(bin_dir, tpath), *speculative_simple(bin_dir, tpath, dpath, prompt)))
        print(f"round {r} llama-bench tg{TOKENS} {tools[-1][0]:.2f} tok/s; llama-speculative-simple "
              f"{tools[-1][1]:.2f} tok/s, accept {tools[-1][2]:.1%}", flush=True)
    bench = statistics.median(x[0] for x in tools)
    simple = statistics.median(x[1] for x in tools)
    for tree, xs in figs.items():
        plain = statistics.median(x["plain"] for x in xs)
        spec = statistics.median(x["spec"] for x in xs)
        print(f"{tree} ({xs[0]['harness']}): plain {plain:.2f} tok/s = {plain / bench:.3f}x llama-bench; "
              f"speculative {spec:.2f} tok/s = {spec / simple:.3f}x llama-speculative-simple "
              f"(accept {xs[0]['accept']:.1%} of the output from the draft)")


if __name__ == "__main__":
    main()
