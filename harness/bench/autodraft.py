"""`harness bench --target PATH` with no --draft and no profile: the default profile's method for the user's own
target (issues 46 and 53), as options, before the plan is made. The drafts: the best one or two GGUFs that can
draft for it, found as `harness drafts` finds them (models.drafts.survey: the target's own folder and the usual
places, llama.cpp's rule, the harness's alignment check, size), then the default profile's model-free proposers
(the harness's lookup and llama.cpp's n-gram types). The method: the default profile's every other setting (every
prompt replayed, the gamma sweep, both policies, the timed subset, the llama-server check, the 20-minute budget
it is fitted to), each as given on the command line where it is. The reasons on stderr."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.models.arch import refusal
from harness.models.drafts import FASTER_RATIO, default_roots, survey

MODELS = 2  # draft models picked at most
PROFILE = "default"  # whose method a bare target gets
OWN = ("target", "draft", "also")  # what the profile's method leaves to the user and the picking
# without the profile (a profiles file that lacks it): the harness's prompt lookup at the N of every committed run
# (docs/findings/which-llamacpp-type.md) and llama.cpp's ngram-mod with its n-max cut from 64 to 16 (on a CPU a
# verify of 65 tokens costs many decodes; n-min 12 keeps llama.cpp's share of it, 48 of 64), fitted to 20 minutes
LOOKUP = "ngram:3"
LLAMA_TYPE = "ngram-mod:n-max=16:n-min=12"
BUDGET_MIN = 20.0
REPLAYED = ("replay", "replay_gamma", "timed_subset", "timed_scope")  # the replay and what rests on it
# an option given -> the method's settings plan refuses beside it
REFUSED = ((lambda o: o.get("replay") is False, REPLAYED), (lambda o: o.get("until_confident"), REPLAYED[2:]),
           (lambda o: o.get("engine") == "server", (*REPLAYED, "prompt_cache", "server_check")))


def with_drafts(profile: str | None, opts: dict, roots: list[Path] | None = None) -> dict:
    """bench's options with the picked drafts and the default profile's method (each option not given) where a
    target is given and neither --draft nor a profile; else as they are. Says what it picked and why on stderr."""
    if profile or opts.get("draft") is not None or not opts.get("target"):
        return opts
    targets = [t for t in str(opts["target"]).split(",") if t]
    parallel = any(x.strip().isdigit() and int(x) > 1 for x in str(opts.get("parallel") or "1").split(","))
    unfit = "--parallel" if parallel else None  # plan refuses llama.cpp's types and the replay there
    method, free, said = default_method(unfit)
    refused = {k for given, keys in REFUSED if given(opts) for k in keys}
    left = []
    if opts.get("engine") == "server":  # llama-server has no prompt lookup of the harness's kind
        left = [d for d in free if d.startswith("ngram:")]
        free = [d for d in free if d not in left]
    drafts, lines = pick(targets, roots, free)
    lines += [f"  {d}: the harness's prompt lookup: left out, as llama-server (--engine server) lacks it" for d in left]
    out = opts | {k: v for k, v in method.items() if opts.get(k) is None and k not in refused} | {"draft": drafts}
    lines.append(said)
    if opts.get("budget_min") is None:
        lines.append(f"  budget: {out['budget_min']:g} minutes, the run cut to fit (--budget-min to change it; "
                     "the budget's first line says what it cut)")
    print("\n".join(lines), file=sys.stderr, flush=True)
    return out


@contextlib.contextmanager
def owning_picks(given: dict, opts: dict):
    """A refusal over a draft model picked here (opts, from with_drafts; given: the user's options) says that it was
    picked, not named, and how to choose instead."""
    from harness.specs import parse_draft
    picked = [] if opts is given else [d for d in opts.get("draft") or [] if not parse_draft(d).model_free]
    try:
        yield
    except HarnessError as e:
        hit = next((d for d in picked if d in str(e) or Path(d).stem in str(e)), None)
        if hit is None:
            raise
        raise HarnessError(f"{e} ({hit} was picked as a draft for you, not named: choose the drafts with --draft, "
                           f"e.g. --draft {LOOKUP})", e.exit_code) from None


def default_method(unfit: str | None = None) -> tuple[dict, list[str], str]:
    """(the default profile's settings but its targets, drafts and further sweeps; its model-free proposers; a
    line saying so). unfit: the option that leaves out llama.cpp's n-gram types and the replay. Without the profile
    (a profiles file that lacks it), LOOKUP and LLAMA_TYPE, gamma 4, greedy, within BUDGET_MIN."""
    from harness.plan import load_profile
    from harness.specs import NGram, parse_draft
    try:
        prof = load_profile(PROFILE)
    except HarnessError as e:
        method, free = {"budget_min": BUDGET_MIN}, [LOOKUP, LLAMA_TYPE]
        said = f"  method: no '{PROFILE}' profile ({e}): gamma 4, greedy, every prompt timed"
    else:
        method = {k: v for k, v in prof.items() if k not in OWN}
        free = [d for d in prof.get("draft", []) if parse_draft(d).model_free]
        said = (f"  method: the '{PROFILE}' profile's (profiles.toml): " +
                ", ".join(f"{k.replace('_', '-')} {_said(v)}" for k, v in method.items()))
    if unfit:
        free = [d for d in free if isinstance(parse_draft(d), NGram)]
        method = {k: v for k, v in method.items() if k not in REPLAYED}
        said += f" (no replay nor llama.cpp's n-gram types: {unfit} does not take them yet)"
    return method, free, said


def _said(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)


def pick(targets: list[str], roots: list[Path] | None = None, free: list[str] | None = None) -> tuple[list[str],
                                                                                                   list[str]]:
    """(the drafts for bench: the draft models' refs, then the model-free proposers `free` (default: LOOKUP and
    LLAMA_TYPE); the lines saying why). A draft model must pass the harness's alignment check against every target;
    ranked as `harness drafts` ranks (llama.cpp's rule first), the best MODELS at most FASTER_RATIO of the targets'
    size, else the best one of any size. roots: where to look (default: each target's folder and
    drafts.default_roots)."""
    from harness.align import check_pair
    from harness.models.catalog import require_present, resolve
    free = [LOOKUP, LLAMA_TYPE] if free is None else free
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
    if free:
        lines.append(f"  {', '.join(free)}: the model-free proposers (the harness's prompt lookup, llama.cpp's "
                     "n-gram types)")
    return [c["ref"] for c in chosen] + free, lines
