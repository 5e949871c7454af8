"""`harness run`: one generation, printed with accepted draft tokens marked, and a summary line."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from harness.analysis import metrics
from harness.divergence import blocks, kernel_check
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


def plan_one(**opts) -> tuple:
    """`harness run`'s options as bench's: a one-instance plan, through bench's own parameter path (plan.make_params
    checks every value, plan.expand builds the instance), bench's defaults where an option is not given. Returns
    (instance, params); the instance is the speculative one, or the plain baseline without a draft."""
    from harness.plan import LIST_KEYS, expand, make_params
    given = {k: v for k, v in opts.items() if v is not None}
    for k, v in given.items():
        if k in LIST_KEYS and "," in str(v):
            raise HarnessError(f"--{k.replace('_', '-')} {v}: harness run takes one value (harness bench sweeps "
                               "lists)")
    params = make_params({}, given)
    if params.draft[0].own_gamma and "gamma" in given:
        raise HarnessError(f"--gamma: {params.draft[0]} drafts up to its own {params.draft[0].own_gamma} tokens, as in "
                           "llama-server: set its n-max (size-m) in the draft instead, e.g. ngram-mod:n-max=16 "
                           "(ngram-cache's is 8)")
    if params.gamma[0].adaptive:
        raise HarnessError("harness run takes a fixed --gamma (auto needs bench's calibration: harness bench "
                           "--gamma auto)")
    found = expand(params)
    return next((i for i in found if not i.baseline), found[0]), params


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


def run_one(inst, n_ctx: int, prompt: Prompt, max_tokens: int, baseline: bool, trace_path: Path | None) -> None:
    """The instance (plan_one's) on one prompt; with baseline, plain decoding after it, compared."""
    if max_tokens < 1:
        raise HarnessError(f"--max-tokens must be >= 1, got {max_tokens}")
    policy, gamma, draft = inst.policy, inst.gamma, not inst.baseline
    trace = TraceWriter(trace_path, keep=True)  # an unwritable trace path is refused before any weights load
    pair = open_pair(inst.target, inst.draft, inst.engine_config(n_ctx), inst.draft_engine_config(n_ctx),
                     check_texts=[prompt], drafting=inst.drafting)
    try:
        text = prompt.render(pair.target.vocab)
        tokens = pair.target.vocab.tokenize(text)
        check_fits(len(tokens), max_tokens, gamma, pair.target.n_ctx)
        req = Request(prompt.id, tokens, max_tokens, prompt.category)
        trace.common = {"target": pair.target_model.name, "draft": str(inst.draft), "policy": policy.label,
                        "mode": "speculative" if draft else "baseline"}
        gen = generate(pair.target, req, policy, pair.proposer, gamma, trace, rule=inst.verify)
        spec_records = list(trace.records)
        color = use_color(sys.stdout)
        click.echo(render_marked(pair.target.vocab, gen["tokens"], gen["from_draft"], color))
        s = metrics.summary(spec_records)
        parts = []
        if draft:
            parts += [f"draft {inst.draft} gamma {gamma}", f"proposed {s['proposed']}", f"accepted {s['accepted']}"]
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
