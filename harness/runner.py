"""`harness run`: one generation, printed with accepted draft tokens marked, and a summary line."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from harness.analysis import metrics
from harness.divergence import blocks, kernel_check
from harness.drafting import Drafting
from harness.engine import EngineConfig
from harness.errors import HarnessError
from harness.loop import Request, check_fits, generate
from harness.pair import open_pair
from harness.prompts import Prompt
from harness.sampling import Policy
from harness.trace import TraceWriter


def render_marked(vocab, tokens: list[int], from_draft: str, color: bool) -> str:
    """Accepted draft tokens in green on a terminal, inside «» otherwise."""
    out, run, run_is_draft = [], [], None

    def flush():
        if not run:
            return
        text = vocab.detokenize(run)
        if run_is_draft:
            text = click.style(text, fg="green") if color else f"«{text}»"
        out.append(text)

    for tok, src in zip(tokens, from_draft):
        is_draft = src == "d"
        if is_draft != run_is_draft:
            flush()
            run, run_is_draft = [], is_draft
        run.append(tok)
    flush()
    return "".join(out)


def check_options(target: str, draft: str | None, gamma: int, policy: Policy, drafting: Drafting, max_tokens: int,
                  cfg: EngineConfig, draft_cfg: EngineConfig) -> None:
    """What bench would refuse of these values, refused by its own checks (plan.check) before any model loads."""
    from harness.plan import Params, check
    check(Params(target=[target], draft=[draft or "none"], gamma=[gamma], temp=[policy.temperature],
                 top_p=[policy.top_p], top_k=[policy.top_k], min_p=[policy.min_p], seed=policy.seed,
                 ngl=[cfg.n_gpu_layers], ngl_draft=[draft_cfg.n_gpu_layers], threads=[cfg.threads],
                 verify=[drafting.verify], draft_p_min=[drafting.p_min], draft_n_min=[drafting.n_min],
                 cache_type_k=[cfg.cache_k], cache_type_v=[cfg.cache_v], cache_type_k_draft=[draft_cfg.cache_k],
                 cache_type_v_draft=[draft_cfg.cache_v], flash_attn=[cfg.flash_attn], ubatch=[cfg.n_ubatch],
                 max_tokens=max_tokens, n_ctx=cfg.n_ctx))


def use_color(stream) -> bool:
    """Colour on a terminal, unless NO_COLOR is set and not empty (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def given_prompt(text: str | None, file: str | None, raw: bool, max_tokens: int) -> Prompt:
    """The prompt `harness run` was given: exactly one of its text or a file holding it, not empty."""
    if (text is None) == (file is None):
        raise HarnessError("give exactly one of --prompt TEXT or --prompt-file FILE")
    if file:
        from harness.prompts import read_prompt_text
        text = read_prompt_text(Path(file))
    else:  # under a non-UTF-8 locale (LC_ALL=C) argv's UTF-8 bytes arrive as surrogates: decode them as UTF-8
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if not text.strip():
        raise HarnessError("the prompt is empty")
    return Prompt("cli", "cli", (("user", text),), text, max_tokens, chat=not raw)


def run_one(target: str, draft: str | None, prompt: Prompt, policy: Policy, gamma: int, max_tokens: int,
            cfg: EngineConfig, draft_cfg: EngineConfig, baseline: bool, trace_path: Path | None,
            drafting: Drafting = Drafting()) -> None:
    if draft and gamma < 1:
        raise HarnessError(f"--gamma must be >= 1, got {gamma}")
    if max_tokens < 1:
        raise HarnessError(f"--max-tokens must be >= 1, got {max_tokens}")
    trace = TraceWriter(trace_path, keep=True)  # an unwritable trace path is refused before any weights load
    pair = open_pair(target, draft, cfg, draft_cfg, check_texts=[prompt], drafting=drafting)
    try:
        text = prompt.render(pair.target.vocab)
        tokens = pair.target.vocab.tokenize(text)
        check_fits(len(tokens), max_tokens, gamma if draft else 0, pair.target.n_ctx)
        req = Request(prompt.id, tokens, max_tokens, prompt.category)
        trace.common = {"target": pair.target_model.name, "draft": draft or "none", "policy": policy.label,
                        "mode": "speculative" if draft else "baseline"}
        gen = generate(pair.target, req, policy, pair.proposer, gamma if draft else 0, trace, rule=drafting.verify)
        spec_records = list(trace.records)
        color = use_color(sys.stdout)
        click.echo(render_marked(pair.target.vocab, gen["tokens"], gen["from_draft"], color))
        s = metrics.summary(spec_records)
        parts = []
        if draft:
            parts += [f"draft {draft} gamma {gamma}", f"proposed {s['proposed']}", f"accepted {s['accepted']}"]
            if s["acceptance_rate"] is not None:
                parts += [f"acceptance {s['acceptance_rate']:.1%}", f"mean accepted/step {s['mean_accepted_len']:.2f}",
                          f"alpha {s['alpha']:.3f}"]
        parts += [f"tokens {s['tokens']}", f"{s['tokens_per_s']:.1f} tok/s", f"policy {policy.label}"]
        line = "  ".join(parts)
        if baseline and draft:
            trace.common["mode"] = "baseline"
            base = generate(pair.target, req, policy, None, 0, trace)
            line += f"  | baseline {base['tokens_per_s']:.1f} tok/s  speedup " \
                    f"{gen['tokens_per_s'] / base['tokens_per_s']:.2f}x  outputs " \
                    f"{_compare(pair.target, req, gen, spec_records, base, policy)}"
        click.echo(line)
    finally:
        trace.close()
        pair.close()


def _compare(target, req: Request, gen: dict, spec_records: list[dict], base: dict, policy: Policy) -> str:
    if gen["tokens"] == base["tokens"]:
        return "equal"
    if not policy.greedy:
        return "differ (expected under sampling: equal in distribution, not token for token)"
    found = kernel_check(target, req.tokens, gen["tokens"], blocks(spec_records), base["tokens"])
    what = {"kernel near-tie": "a kernel near-tie: the target's argmax there differs between a single-token "
                               "decode and the verification block",
            "mismatch": "a MISMATCH: the target chooses the same token both ways there; please report it",
            "unchecked": "unchecked"}[found["kind"]]
    return f"differ at token {found['diverged_at']} ({what}; top-2 margin {found['margin']})"
