"""Does a paired plain twin decode at the pace of plain decoding alone? (prints figures; not a test). Run alone.

Issue 53 found the paired plain twins of a speculative F16 configuration 10-20% slower than the same prompts'
plain baseline unit, and both slower than llama-server's plain. A twin differs from the baseline unit in what its
worker holds and does: the draft model loaded (its weights, its context, its threads), and the speculative
generations it alternates with. Each condition is timed here on the same prompts, the conditions taking turns in
rounds so that a slow spell of the machine lands on all of them:

- alone: the target's Engine alone (what the baseline unit runs);
- beside an idle draft: the same, with the draft model's Engine loaded and unused;
- twin: the same plain generation right after a speculative one of the same prompt (what a paired worker runs);
- llama-server plain: llama.cpp's own server on the same token ids (`make native`'s build), one request at a time.

Plain generation through harness.loop.generate, greedy, the prompt evaluated before the clock starts (as the
loop times it: tokens/s after the prompt)."""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

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


def server_paces(path: Path, prompts: list[list[int]], tokens: int, threads: int) -> list[float]:
    """llama-server's plain tokens/s per prompt, as its own timings give them (predicted_n over predicted_ms)."""
    from harness.crosscheck import binary
    from harness.crosscheck.run import ask, payload
    from harness.crosscheck.server import Server, free_port
    with tempfile.TemporaryDirectory() as d:
        args = ["-m", str(path), "-c", "2048", "-np", "1", "-t", str(threads), "-ngl", "0"]
        with Server(binary.find(None), args, free_port(), Path(d) / "server.log", "plain") as srv:
            srv.start(300)
            ask(srv, "warm-up", payload(prompts[0], tokens, Policy(temperature=0.0)), 600)
            recs = [ask(srv, str(k), payload(t, tokens, Policy(temperature=0.0)), 600) for k, t in enumerate(prompts)]
    return [r["predicted_n"] * 1000 / r["predicted_ms"] for r in recs]


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
    out: dict[str, list[float]] = {"alone": [], "beside an idle draft": [], "twin": [], "speculative": [],
                                   "llama-server plain": []}
    for rnd in range(a.rounds):
        order = ["alone", "pair", "server"] if rnd % 2 == 0 else ["server", "pair", "alone"]
        for what in order:
            target = Engine(target_path, cfg)
            reqs = [Request(p.id, target.vocab.tokenize(p.render(target.vocab)), a.tokens) for p in prompts]
            if what == "server":
                target.close()
                out["llama-server plain"] += server_paces(target_path, [r.tokens for r in reqs], a.tokens,
                                                          cfg.resolved_threads())
                continue
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
