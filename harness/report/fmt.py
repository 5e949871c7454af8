"""Formatting of figures for the Markdown report."""
from __future__ import annotations

import re
import textwrap

from tabulate import tabulate


def f(v, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


def mib(v) -> str:
    return "" if v is None else f"{v / 2**20:.0f} MiB"


def table(rows: list[list], headers: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def beside(x: float, bar: float, spec: str = ".2f") -> str:
    """x to `spec`, with a third decimal where it would round to the bar it is compared with."""
    return f"{x:.3f}" if x != bar and f"{x:{spec}}" == f"{bar:{spec}}" else f"{x:{spec}}"


def ci(x, lo, hi, spec: str = ".2f", unit: str = "") -> str:
    """'1.04x [0.93, 1.16]'; the figure alone when there is no interval. A speedup bound that would round to
    1.00 gets a third decimal: which side of 1 it lies on is the verdict."""
    if x is None:
        return ""
    if lo is None or hi is None:
        return f"{x:{spec}}{unit}"

    def bound(b):
        return beside(b, 1, spec) if unit == "x" else f"{b:{spec}}"
    return f"{x:{spec}}{unit} [{bound(lo)}, {bound(hi)}]"


def pct_ci(x, lo, hi) -> str:
    """'71% [63, 79]'."""
    if x is None:
        return ""
    if lo is None or hi is None:
        return f"{x:.0%}"
    return f"{x:.0%} [{lo * 100:.0f}, {hi * 100:.0f}]"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def contents(before: list[str], lines: list[str], *extra: str) -> list[str]:
    """A table of contents of the `## ` headings in lines (the sections below it), each a link to its anchor as
    GitHub numbers it among every heading of the page (before: the lines above the contents), and the extra
    items after them."""
    seen: dict[str, int] = {}
    items = []
    for k, ln in enumerate([*before, "## Contents", *lines]):
        m = re.match(r"(#{1,6}) (.*)", ln)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        if m.group(1) == "##" and k > len(before):
            items.append(f"- [{m.group(2).strip()}](#{base if n == 0 else f'{base}-{n}'})")
    return ["## Contents", "", *items, *(f"- {x}" for x in extra), ""]


WIDTH = 120  # the first screen's line length (code blocks and tables excepted)


def wrap(lines: list[str], width: int = WIDTH) -> list[str]:
    """Markdown prose folded at `width`, a list item's continuation indented under its text; code blocks, tables,
    headings and images as they are."""
    out, code = [], False
    for ln in lines:
        if ln.startswith("```"):
            code = not code
        if code or ln.startswith(("```", "|", "#", "![")) or len(ln) <= width:
            out.append(ln)
            continue
        m = re.match(r"(\s*(?:- )?)", ln)
        indent = " " * len(m.group(1))
        out += textwrap.wrap(ln, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return out
