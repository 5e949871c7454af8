"""`harness server-check COMMAND --synth N`: what acceptance the command's speculative type must reach to pay on
this machine, measured in llama-server with no draft quality involved: the llama-server counterpart of the
harness's break-even.

llama-server's benchmark-only synthetic acceptance (`--spec-synth-len L`, where the build has it) accepts each
drafted token at random, at the per-token rate that gives L tokens per verification step on average (the
target's own token included), so the draft model drafts and the target verifies as ever and only what is
accepted is set (the output is not valid text, and is not compared). The command runs at N lengths from 1
(nothing accepted) to its longest draft + 1 (everything), each beside its plain twin over the same prompts, in
server-check's order (a server per request, one at a time, ABBA). The break-even is the acceptance
(accepted / drafted, as each synthetic server reported it) at which the speedup crosses 1, interpolated between
the two lengths around it; the command's own acceptance, from its real run, stands beside it."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from harness.analysis.serverstats import acceptance, speedup
from harness.errors import HarnessError

SYNTH_FLAG = "--spec-synth-len"
# each type's longest draft, as common_speculative_n_max reads it: (the flag, llama.cpp's default)
N_MAX = {"draft": ("--spec-draft-n-max", 3), "ngram-simple": ("--spec-ngram-simple-size-m", 48),
         "ngram-map-k": ("--spec-ngram-map-k-size-m", 48), "ngram-map-k4v": ("--spec-ngram-map-k4v-size-m", 48),
         "ngram-mod": ("--spec-ngram-mod-n-max", 64), "ngram-cache": (None, 8)}


def n_max(types: list[str], given: dict[str, str]) -> int:
    """The longest draft of the command's types (the largest, as llama.cpp takes it), from its flags (given:
    each flag's value, as llama.cpp spells the flag) or their defaults."""
    out = 0
    for t in types:
        name, default = N_MAX["draft" if t.startswith("draft") else t] if (t.startswith("draft") or t in N_MAX) \
            else (None, 0)
        try:
            out = max(out, int(given.get(name, default)) if name else default)
        except ValueError:
            raise HarnessError(f"the command's {name} {given[name]} is not a whole number") from None
    return out


def check(types: list[str], given: dict[str, str], known: frozenset[str]) -> int:
    """The command's longest draft, where synthetic acceptance can measure it; one line where it cannot."""
    if SYNTH_FLAG not in known:
        raise HarnessError(f"--synth: this llama-server has no {SYNTH_FLAG} (its --help does not list it): give "
                           "--llama-server a build that has it")
    real = [t for t in types if t != "none"]
    if not real:
        raise HarnessError("--synth sets how much of a draft is accepted: give the command a --spec-type that drafts")
    if not any(t.startswith("draft") for t in real):
        raise HarnessError(f"--synth: --spec-type {','.join(real)} drafts only where the output repeats an n-gram, "
                           "so a synthetic acceptance would set little; it measures a draft model's type "
                           "(draft-simple and the like), which drafts every step")
    return n_max(types, given)


MAX_LENGTHS = 16  # --synth's most: each length starts two servers a prompt, one at a time


def lengths(n: int, count: int) -> list[float]:
    """count mean lengths from 1 to n + 1, evenly spaced, to two decimals (each once)."""
    if count < 2:
        raise HarnessError(f"--synth N needs N >= 2 lengths (1 and the longest draft + 1), got {count}")
    if count > MAX_LENGTHS:
        raise HarnessError(f"--synth {count}: at most {MAX_LENGTHS} lengths (each starts two llama-servers per "
                           f"prompt, one after the other, so {count} would start {2 * count} per prompt): give fewer")
    return list(dict.fromkeys(round(1 + n * i / (count - 1), 2) for i in range(count)))


def crossing(points: list[tuple[float, float]], at: float = 1.0) -> float | None:
    """The x at which y first crosses `at`, going up in x, interpolated linearly; None where it never does."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if (y0 - at) * (y1 - at) <= 0 and y0 != y1:
            return x0 + (at - y0) * (x1 - x0) / (y1 - y0)
    return None


def run(measure, c, log_dir: Path, count: int, n: int) -> list[dict]:
    """Per synthetic length: {length, acceptance, speedup, lo, hi}, from the command c (servercheck.Command) at
    that length and its plain twin; measure(command, log_dir) measures a command over the prompts."""
    rows = []
    todo = lengths(n, count)
    for k, length in enumerate(todo, 1):
        click.echo(f"server-check --synth: length {length:g} ({k} of {len(todo)})", err=True)
        measured = measure(replace(c, spec=[*c.spec, SYNTH_FLAG, f"{length:g}"]), log_dir / f"synth-{length:g}")
        s, a = speedup(measured), acceptance(measured)
        rows.append({"length": length, "acceptance": a["acceptance"], "speedup": s["speedup"], "lo": s["lo"],
                     "hi": s["hi"]})
    return rows


def render(rows: list[dict], own: float | None, n: int) -> list[str]:
    """The table and the break-even beside the command's own acceptance."""
    from harness.report.fmt import ci, table
    lines = ["", f"## What acceptance pays here (llama-server's synthetic acceptance, {SYNTH_FLAG}; longest draft "
                 f"{n})", "",
             table([[f"{r['length']:g}", "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}",
                     ci(r["speedup"], r["lo"], r["hi"], unit="x")] for r in rows],
                   ["mean tokens a step", "accepted / drafted", "speedup [95% CI]"]), ""]
    points = [(r["acceptance"], r["speedup"]) for r in rows if r["acceptance"] is not None and r["speedup"]]
    even = crossing(sorted(points))
    mine = "" if own is None else f"; your command's own: {own:.0%}"
    if even is None:
        top = max((y for _, y in points), default=None)
        lines.append("- Break-even: none in range: " + (
            f"even full acceptance gains only {top:.2f}x here{mine}" if top is not None and top < 1 else
            f"every measured acceptance gains{mine}"))
    else:
        lines.append(f"- Break-even: {even:.0%} of drafted tokens accepted{mine}" + (
            "" if own is None else f" ({'above' if own > even else 'below'} it)"))
    lines.append("- The speedups are the points' own, each over the prompts with its plain twin; the break-even is "
                 "read between the two points around 1x")
    return lines
