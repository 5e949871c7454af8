"""`harness bench --target PATH` with no --draft and no profile: the drafts picked for the target (issue 46), as
options, before the plan is made. The best one or two GGUFs that can draft for it, found as `harness drafts`
finds them (models.drafts.survey: the target's own folder and the usual places, llama.cpp's rule, the harness's
alignment check, size), and the model-free proposers; the reasons on stderr."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.models.arch import refusal
from harness.models.drafts import FASTER_RATIO, default_roots, survey

MODELS = 2  # draft models picked at most
# the harness's prompt lookup at the N of every committed run (docs/findings/which-llamacpp-type.md)
LOOKUP = "ngram:3"
# llama.cpp's ngram-mod with its n-max cut from 64 to 16: on a CPU a verify of 65 tokens costs many decodes, so a
# 64-token draft pays only where nearly all of it is accepted; n-min 12 keeps llama.cpp's default share of it (48
# of 64). A choice for a CPU, not a measured optimum.
LLAMA_TYPE = "ngram-mod:n-max=16:n-min=12"
BUDGET_MIN = 20.0  # make bench's: a run of every prompt at each prompt's own length is cut to fit


def with_drafts(profile: str | None, opts: dict, roots: list[Path] | None = None) -> dict:
    """bench's options with the picked drafts (and, where none is given, BUDGET_MIN) where a target is given and
    neither --draft nor a profile; else as they are. Says what it picked and why on stderr."""
    if profile or opts.get("draft") is not None or not opts.get("target"):
        return opts
    targets = [t for t in str(opts["target"]).split(",") if t]
    parallel = any(x.strip().isdigit() and int(x) > 1 for x in str(opts.get("parallel") or "1").split(","))
    unfit = "--parallel" if parallel else None  # plan refuses the type there
    drafts, lines = pick(targets, roots, unfit, lookup=opts.get("engine") != "server")
    out = opts | {"draft": drafts}
    if opts.get("budget_min") is None:
        out["budget_min"] = BUDGET_MIN
        lines.append(f"  budget: {BUDGET_MIN:g} minutes, the run cut to fit (--budget-min to change it)")
    print("\n".join(lines), file=sys.stderr, flush=True)
    return out


@contextlib.contextmanager
def owning_picks(given: dict, opts: dict):
    """A refusal over a draft model picked here (opts, from with_drafts; given: the user's options) says that it was
    picked, not named, and how to choose instead."""
    picked = [] if opts is given else [d for d in opts.get("draft") or [] if d not in (LOOKUP, LLAMA_TYPE)]
    try:
        yield
    except HarnessError as e:
        hit = next((d for d in picked if d in str(e) or Path(d).stem in str(e)), None)
        if hit is None:
            raise
        raise HarnessError(f"{e} ({hit} was picked as a draft for you, not named: choose the drafts with --draft, "
                           f"e.g. --draft {LOOKUP})", e.exit_code) from None


def pick(targets: list[str], roots: list[Path] | None = None, unfit: str | None = None,
         lookup: bool = True) -> tuple[list[str], list[str]]:
    """(the drafts for bench: the draft models' refs, then LOOKUP and LLAMA_TYPE; the lines saying why). A draft
    model must pass the harness's alignment check against every target; ranked as `harness drafts` ranks
    (llama.cpp's rule first), the best MODELS at most FASTER_RATIO of the targets' size, else the best one of any
    size. roots: where to look (default: each target's folder and drafts.default_roots). unfit: the option that
    leaves LLAMA_TYPE out (llama.cpp's n-gram types are not served to several requests yet). lookup: False leaves
    LOOKUP out (--engine server: llama-server has no such lookup)."""
    from harness.align import check_pair
    from harness.models.catalog import require_present, resolve
    models = [resolve(t) for t in targets]
    paths = [require_present(m) for m in models]
    where = roots if roots is not None else list(dict.fromkeys([p.parent for p in paths] + default_roots()))
    real = {os.path.realpath(p) for p in paths}
    surveys = [survey(p, m.name, where, align=check_pair) for m, p in zip(models, paths)]
    # a recurrent or hybrid draft, or an EAGLE-3 or DFlash head, the harness's loop cannot run (models.arch)
    usable = [{os.path.realpath(c["path"]): c for c in s["candidates"] if c["rank"] is not None and c["harness"]["ok"]
               and refusal("", c["arch"]) is None} for s in surveys]
    compatible = [c for c in surveys[0]["candidates"] if os.path.realpath(c["path"]) not in real
                  and all(os.path.realpath(c["path"]) in u for u in usable)]
    faster = [c for c in compatible if all(u[os.path.realpath(c["path"])]["plausibly_faster"] for u in usable)]
    chosen = faster[:MODELS] or compatible[:1]  # too big to be likely to gain: measured to show it
    named = ", ".join(m.name for m in models)
    folders = ", ".join(map(str, where)) or "no folder"
    lines = [f"No --draft: picked for {named} (`harness drafts {targets[0]}` lists every candidate):"]
    for c in chosen:
        clause = c["llama_cpp"]["clause"]
        server = f"llama-server refuses it: {clause}" if clause else "llama-server takes it"
        size = "" if c in faster else f" (over {FASTER_RATIO:g}x: unlikely to gain, the best there is)"
        lines.append(f"  {c['ref']}: {c['size_ratio']:.2f}x the target's size{size}; {server}; harness check "
                     f"{c['harness']['verdict']}")
    if not chosen:
        found = sum(len(s["candidates"]) for s in surveys)
        lines.append(f"  no draft model: none of the {found} GGUFs in {folders} passes the harness's alignment check "
                     "and runs in its loop, so the model-free proposers only")
    lines += [f"  {LOOKUP}: the harness's prompt lookup (model-free)" + ("" if lookup else ": left out, as "
                                                                         "llama-server (--engine server) lacks it"),
              f"  {LLAMA_TYPE}: llama.cpp's ngram-mod (model-free), its n-max cut from 64 to 16 for a CPU" +
              (f": left out, as {unfit} does not take llama.cpp's n-gram types yet" if unfit else "")]
    return [c["ref"] for c in chosen] + [LOOKUP] * lookup + [LLAMA_TYPE] * (not unfit), lines
