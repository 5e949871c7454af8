"""Evidence until settled (`--until-confident`): after each round, the categories whose verdict is still
inconclusive get their next prompt, in each category's fixed file order (so a rerun adds the same prompts),
until every verdict settles, the budget is spent or those categories run out of prompts."""
from __future__ import annotations

from harness.analysis.verdict import INCONCLUSIVE


def open_categories(verdicts) -> list[str]:
    """Categories with at least one inconclusive verdict (any target, offload or policy), in report order."""
    if verdicts is None or not len(verdicts):
        return []
    return list(dict.fromkeys(r["category"] for r in verdicts.iter_rows(named=True) if r["verdict"] == INCONCLUSIVE))


def next_round(open_cats: list[str], pool: list, used: set[str]) -> tuple[list, list[str]]:
    """The next unused prompt of each open category (pool in file order), and the open categories without one."""
    add, exhausted = [], []
    for cat in open_cats:
        nxt = next((p for p in pool if p.category == cat and p.id not in used), None)
        if nxt is None:
            exhausted.append(cat)
        else:
            add.append(nxt)
    return add, exhausted
