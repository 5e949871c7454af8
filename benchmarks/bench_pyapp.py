"""llama-cpp-python's own speculative decoding, measured as a user's app would run it (issue 56; prints figures,
not a test; run alone: `.venv/bin/python benchmarks/bench_pyapp.py`).

Per target and policy, on the first N code prompts at 128 tokens, in one sitting: `create_completion` plain,
with `GGUFDraft` (the 0.5B draft at n_max 3, llama.cpp's default) and with `LlamaPromptLookupDecoding` (its
defaults), then the harness's own loop on the same prompts, plain and with the same draft at gamma 3. Each
prompt is evaluated once beforehand (a 1-token completion), so the timed call restores it from the prefix cache
and times the generation, as the harness's loop does. Speedups are against the same engine's plain run. Both
engines run the harness's threads (the physical cores)."""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from harness import GGUFDraft
from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.models.catalog import resolve
from harness.proposers import DraftModelProposer
from harness.sampling import Policy

N_CTX = 1024
THREADS = EngineConfig().resolved_threads()


def prompts(n: int) -> list[list[dict]]:
    rows = [json.loads(x) for x in Path("prompts/code.jsonl").read_text().splitlines() if x.strip()]
    return [r["messages"] for r in rows[:n]]


def rendered(path: Path, chats: list[list[dict]]) -> list[str]:
    with Engine(path, EngineConfig(n_ctx=N_CTX)) as e:
        return [e.vocab.apply_chat_template(c) for c in chats]


def pace(llm: Llama, text: str, tokens: int, temp: float, seed: int) -> float:
    """tok/s of one completion, its prompt evaluated beforehand."""
    llm.create_completion(text, max_tokens=1, temperature=0.0)
    t0 = time.perf_counter()
    out = llm.create_completion(text, max_tokens=tokens, temperature=temp, top_p=0.9 if temp else 1.0, top_k=0,
                                min_p=0.0, seed=seed)
    return out["usage"]["completion_tokens"] / (time.perf_counter() - t0)


def app(target: Path, draft: Path, texts: list[str], tokens: int, temp: float) -> dict[str, list[float]]:
    made = {"plain": lambda: None, "GGUFDraft": lambda: GGUFDraft(draft, n_max=3, n_ctx=N_CTX),
            "prompt lookup": LlamaPromptLookupDecoding}
    out = {}
    for name, make in made.items():
        d = make()
        # the harness's threads (physical cores; Llama's default is half the logical ones), and logits_all with a
        # draft, which llama-cpp-python 0.3.36 needs past n_batch tokens (GGUFDraft.check says so)
        llm = Llama(str(target), n_ctx=N_CTX, n_threads=THREADS, seed=0, verbose=False, draft_model=d,
                    logits_all=d is not None)
        out[name] = [pace(llm, t, tokens, temp, k) for k, t in enumerate(texts)]
        out[name + " scores GiB"] = [llm.scores.nbytes / 2**30]  # logits_all's buffer: every position's row
        del llm
        if d is not None and hasattr(d, "close"):
            d.close()
    return out


def own_loop(target: Path, draft: Path, texts: list[str], tokens: int, temp: float) -> dict[str, list[float]]:
    cfg = EngineConfig(n_ctx=N_CTX)
    out: dict[str, list[float]] = {"harness plain": [], "harness draft γ3": []}
    with Engine(target, cfg) as t, Engine(draft, cfg) as d:
        prop = DraftModelProposer(d)
        for k, text in enumerate(texts):
            req = Request(f"p{k}", t.vocab.tokenize(text), tokens)
            pol = Policy(temperature=temp, top_p=0.9 if temp else 1.0, seed=k)
            out["harness plain"].append(generate(t, req, pol)["tokens_per_s"])
            out["harness draft γ3"].append(generate(t, req, pol, prop, 3)["tokens_per_s"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="qwen2.5-coder-1.5b-instruct-q4_k_m,qwen2.5-coder-1.5b-instruct-f16")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_0")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    draft = resolve(a.draft).path
    chats = prompts(a.prompts)
    for name in a.targets.split(","):
        target = resolve(name).path
        texts = rendered(target, chats)
        for temp in (0.0, 0.7):
            r = app(target, draft, texts, a.tokens, temp) | own_loop(target, draft, texts, a.tokens, temp)
            pol = "greedy" if not temp else "T=0.7 top_p=0.9"
            print(f"{name}, {pol}, {len(texts)} code prompts, {a.tokens} tokens, draft {a.draft}:")
            for engine, base in (("llama-cpp-python", "plain"), ("harness loop", "harness plain")):
                for k, v in r.items():
                    if "GiB" in k or (engine == "harness loop") != k.startswith("harness"):
                        continue
                    ratio = statistics.mean(x / y for x, y in zip(v, r[base]))
                    rss = f", logits buffer {r[k + ' scores GiB'][0]:.2f} GiB" if k + " scores GiB" in r else ""
                    print(f"  {engine:16s} {k:17s} {statistics.mean(v):6.1f} tok/s  {ratio:.2f}x its plain "
                          f"(per prompt {', '.join(f'{x:.1f}' for x in v)}){rss}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
