"""Does a paired plain twin decode at the pace of plain decoding alone? (prints figures; not a test). Run alone.

Issue 53 found the paired plain twins of a speculative F16 configuration 10-20% slower than the same prompts'
plain baseline unit, and both slower than llama-server's plain. A twin differs from the baseline unit in what its
worker holds and does: the draft model loaded (its weights, its context, its threads), and the speculative
generations it alternates with. Each condition is timed here on the same prompts, the conditions taking turns in
rounds so that a slow spell of the machine lands on all of them:

- alone: the target's Engine alone (what the baseline unit runs);
- beside an idle draft: the same, with the draft model's Engine loaded and unused;
- twin: the same plain generation right after a speculative one of the same prompt (what a paired worker runs).

Plain generation through harness.loop.generate, greedy, the prompt evaluated before the clock starts (as the
loop times it: tokens/s after the prompt)."""
from __future__ import annotations

import argparse
import statistics
import time

from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.models.catalog import resolve
from harness.prompts import load
from harness.proposers import DraftModelProposer
from harness.sampling import Policy

CATEGORIES = ["code", "domain", "creative"]  # the first prompt of each: prompts/*.jsonl


def pace(engine: Engine, req: Request, proposer=None, gamma: int = 0) -> float:
    """Tokens/s of one generation after its prompt, as the loop's own record times it."""
    rec = generate(engine, req, Policy(temperature=0.0), proposer, gamma)
    return rec["n_tokens"] * 1000 / rec["gen_ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-f16")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_0")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    cfg = EngineConfig(n_ctx=2048)
    target_path, draft_path = resolve(a.target).path, resolve(a.draft).path
    prompts = [next(p for p in load([c]) if p.category == c) for c in CATEGORIES]
    out: dict[str, list[float]] = {"alone": [], "beside an idle draft": [], "twin": [], "speculative": []}
    for rnd in range(a.rounds):
        order = ["alone", "pair"] if rnd % 2 == 0 else ["pair", "alone"]
        for what in order:
            target = Engine(target_path, cfg)
            reqs = [Request(p.id, target.vocab.tokenize(p.render(target.vocab)), a.tokens) for p in prompts]
            pace(target, reqs[0])  # warm-up: the weights paged in
            if what == "alone":
                out["alone"] += [pace(target, r) for r in reqs]
            else:
                draft = Engine(draft_path, cfg)
                prop = DraftModelProposer(draft, a.draft)
                out["beside an idle draft"] += [pace(target, r) for r in reqs]
                for r in reqs:
                    out["speculative"].append(pace(target, r, prop, a.gamma))
                    out["twin"].append(pace(target, r))
                draft.close()
            target.close()
        time.sleep(1)
    ref = statistics.median(out["alone"])
    print(f"{a.target}, {a.tokens} tokens, greedy, {len(prompts)} prompts x {a.rounds} rounds (medians, tok/s)")
    for k, v in out.items():
        print(f"  {k:22s} {statistics.median(v):6.2f}  ({min(v):.2f}-{max(v):.2f})  {statistics.median(v) / ref:.3f}x")


if __name__ == "__main__":
    main()
