"""What `harness crosscheck` runs for a finished run: the configurations its answers name (report.answer), each
with llama-server's command lines (howto: speculative, and the same without the --spec-* flags for the
plain baseline), the run's prompts of that category as the harness's own token ids, and the harness's figures
to put beside llama.cpp's."""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from harness.analysis.predict import ALL
from harness.analysis.verdict import SPECULATE
from harness.errors import HarnessError

ONLY = ("all", "speculate")
POOLED_MIN = 5  # prompts behind a bottom line's llama-server figure, spread over the categories


@dataclass
class Check:
    answer: dict          # the answer's fields (report.answer), without its instance
    inst: object          # instance.Instance
    prompts: list         # [(prompt id, token ids, max tokens)]
    spec_args: list[str]  # llama-server's flags, the binary left out
    plain_args: list[str]
    harness: dict         # the harness's speedup and acceptance with their intervals
    key: str = field(default="")
    skip: str = ""        # why it cannot be checked ("" where it can)


def server_args(command: str) -> tuple[list[str], list[str]]:
    """howto's llama-server command line as (speculative flags, plain flags): the plain one drops every --spec-*
    flag with its value (each takes one)."""
    words = shlex.split(command)[1:]
    plain, k = [], 0
    while k < len(words):
        if words[k].startswith("--spec-"):
            k += 2
            continue
        plain.append(words[k])
        k += 1
    return words, plain


def run_prompts(plan: dict, category: str, per_category: int = 0) -> list:
    """The run's prompts of `category` (every round's, in order), read again from its prompt files and checked
    against the digests the plan recorded."""
    from harness.plan import Params, prompt_pool
    from harness.rundir import plan_rounds
    params = Params.from_dict(plan["params"])
    ids = list(dict.fromkeys(i for r in plan_rounds(plan) for i in r))
    pool = {p.id: p for p in prompt_pool(params, plan.get("categories"))}
    digests = plan.get("prompt_digests", {})
    out = []
    for i in ids:
        p = pool.get(i)
        if p is None:
            raise HarnessError(f"prompt '{i}' of the run is no longer in its prompt files: crosscheck needs the "
                               "run's own prompts (run it where the run ran, or restore the files)")
        if digests.get(i) and p.digest != digests[i]:
            raise HarnessError(f"prompt '{i}' changed since the run: crosscheck needs the run's own prompts")
        if p.category == category or category == ALL:
            out.append(p)
    if category == ALL:  # the bottom line's: the first prompts of each category, POOLED_MIN of them at least
        cats = list(dict.fromkeys(p.category for p in out))
        k = pooled_share(len(cats))
        return [p for c in cats for p in [q for q in out if q.category == c][:k]]
    return out[:per_category] if per_category else out


def pooled_share(categories: int) -> int:
    """Prompts per category behind a bottom line's check: POOLED_MIN at least, spread evenly."""
    return -(-POOLED_MIN // categories) if categories else 0


def tokenize(target_path: Path, prompts: list, max_tokens: int) -> list[tuple[str, list[int], int]]:
    """Each prompt rendered and tokenized as the bench worker does (chat template, special tokens added)."""
    from harness.llamacpp import Vocab, llama, load_model
    model = load_model(target_path, vocab_only=True)
    try:
        v = Vocab(model)
        return [(p.id, v.tokenize(p.render(v)), max_tokens or p.max_tokens) for p in prompts]
    finally:
        llama().llama_model_free(model)


def model_file(ref: str) -> Path:
    """The file of a catalog name or path, or the harness's one line on a model that is not there."""
    from harness.models.catalog import require_present, resolve
    return require_present(resolve(ref))


def harness_figures(data: dict[str, pl.DataFrame], a: dict, inst) -> dict:
    """The harness's speedup [CI] (the answer's) and acceptance [CI] of the same configuration and category:
    the timed sweep's row, or the replay's prediction."""
    out = {"speedup": a["speedup"], "lo": a["lo"], "hi": a["hi"], "acceptance": None, "acceptance_lo": None,
           "acceptance_hi": None}
    timed = a["source"].startswith("timed")  # "timed on N prompt(s)", or "predicted from every prompt"
    pooled = a["category"] == ALL
    rows = data.get(("sweep_pooled" if pooled else "sweep") if timed else "replay_pooled" if pooled else "replay")
    if rows is None or not len(rows):
        return out
    if timed:
        rows = rows.filter((pl.col("config") == inst.id) & (pl.col("category") == a["category"]))
    else:
        rows = rows.filter((pl.col("base") == inst.plain().id) & (pl.col("category") == a["category"])
                           & (pl.col("draft") == str(inst.draft)) & (pl.col("gamma") == inst.gamma)
                           & (pl.col("adaptive") == inst.adaptive))
        same = rows.filter(pl.col("verify") == inst.verify)
        rows = same if len(same) else rows
    if len(rows):
        r = rows.row(0, named=True)
        out |= {"acceptance": r.get("acceptance_rate"), "acceptance_lo": r.get("acceptance_rate_lo"),
                "acceptance_hi": r.get("acceptance_rate_hi")}
    return out


def key(inst, category: str, prompts: list, spec_args: list[str]) -> str:
    """What a finished row was measured on: a rerun skips a row whose key is unchanged."""
    blob = json.dumps([inst.id, category, [(i, len(t), m) for i, t, m in prompts], spec_args])
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def checks(run_dir: Path, only: str = "all", per_category: int = 0) -> tuple[list[Check], dict]:
    """The checks of a run and its plan: every "speculate" answer, and (only="all") the configuration every other
    answer names as its best."""
    from harness.report.answer import answers
    from harness.howto import howto
    from harness.report.tables import compute
    from harness.rundir import read_plan
    if only not in ONLY:
        raise HarnessError(f"--only {only}: give one of {', '.join(ONLY)}")
    plan = read_plan(run_dir)
    data = compute(run_dir)
    found = answers(data, plan, pooled=True) + answers(data, plan)  # the bottom lines first
    if not found:
        raise HarnessError(f"{run_dir} has no verdicts yet (no finished speculative configuration): nothing to "
                           "crosscheck")
    n_ctx = plan.get("params", {}).get("n_ctx", 2048)
    max_tokens = plan.get("params", {}).get("max_tokens", 0)
    out, tokens = [], {}
    for a in found:
        if only == "speculate" and a["verdict"] != SPECULATE:
            continue
        inst = a.pop("instance", None)
        c = Check(a, inst, [], [], [], {})
        if inst is None or inst.draft.plain:
            out.append(c)
            c.skip = "no configuration named"
            continue
        c.harness = harness_figures(data, a, inst)
        if inst.parallel > 1:
            c.skip = f"parallel {inst.parallel}: crosscheck sends one request at a time"
            out.append(c)
            continue
        c.spec_args, c.plain_args = server_args(howto(inst, n_ctx).server)
        k = (inst.target, a["category"])
        if k not in tokens:
            tokens[k] = tokenize(model_file(inst.target), run_prompts(plan, a["category"], per_category),
                                 max_tokens)
        # a draft model that is not there: one line now, before any server starts; after the target, so that with
        # both missing the line names the target whichever configuration the run found best
        if inst.draft.model:
            model_file(inst.draft.model)
        c.prompts = tokens[k]
        c.key = key(inst, a["category"], c.prompts, c.spec_args)
        out.append(c)
    if not out:
        raise HarnessError(f"{run_dir}: no answer says speculate (--only speculate): nothing to crosscheck; leave "
                           "--only out to check the other verdicts' best configurations")
    return out, plan
