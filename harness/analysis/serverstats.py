"""llama.cpp's figures for one configuration from the server's own timings, paired per prompt, and whether the
harness's verdict holds there. Pure functions over the per-prompt records crosscheck.json keeps.

- A server's speed on a prompt is its own generation rate: (predicted_n - 1) / predicted_ms, as llama-server's
  predicted_per_second counts it (the first token comes from the prompt's logits; prompt evaluation is apart).
- The speedup is the geometric mean over prompts of speculative over plain, with a t interval on the per-prompt
  log ratios (analysis.intervals: n - 1 degrees of freedom; one prompt gives no interval).
- Acceptance is accepted over drafted tokens, pooled over prompts (draft_n_accepted / draft_n), with the ratio
  estimator's standard error from the prompts and the same t quantile.
- The rule, at the run's least gain worth having g (--min-gain), on llama.cpp's 95% interval [lo, hi]:
  speculate holds when lo > 1 + g (the harness's own bar) and is contradicted when hi < 1 + g; no gain worth
  having holds when hi < 1 + g and is contradicted when lo > 1 + g; plain decoding holds when hi < 1 and is
  contradicted when lo > 1. Anything else is unsettled (more prompts would tell). An inconclusive verdict
  claims nothing, so nothing is checked; llama.cpp's own reading is given beside it."""
from __future__ import annotations

import math

from harness.analysis.intervals import LEVEL, interval
from harness.analysis.verdict import INCONCLUSIVE, NO_GAIN, PLAIN, SPECULATE

HOLDS, CONTRADICTED, UNSETTLED, NOT_CHECKED = "holds", "contradicted", "unsettled", "-"
COUNTS, TIMES = ("predicted_n", "draft_n", "draft_n_accepted", "prompt_n"), ("predicted_ms", "prompt_ms")


def fault(t: dict, n_predict: int | None = None) -> str | None:
    """What keeps one response's timings from being a measurement, naming the field; None when nothing does.
    Counts are whole numbers and times finite ones, none below 0; a response predicted at least one token, more
    than one in some time, no more than the n_predict asked (where given) and as many as its token ids (where it
    holds them: a list of whole numbers), and accepted no more drafts than it drafted or generated."""
    for k in COUNTS + TIMES:
        v = t.get(k)
        if v is None and k.startswith("prompt"):  # not used in any figure: an older server may leave them out
            continue
        number = isinstance(v, int) if k in COUNTS else isinstance(v, (int, float)) and math.isfinite(v)
        if isinstance(v, bool) or not number:
            return f"timings.{k} {v!r} (not a {'whole number' if k in COUNTS else 'finite number'})"
        if v < 0:
            return f"timings.{k} {v!r} (below 0)"
    if t["predicted_n"] < 1:
        return f"timings.predicted_n {t['predicted_n']} (no token generated)"
    if t["predicted_n"] > 1 and t["predicted_ms"] == 0:
        return f"timings.predicted_ms 0 for {t['predicted_n']} tokens"
    if t["draft_n_accepted"] > t["draft_n"]:
        return f"timings.draft_n_accepted {t['draft_n_accepted']} above timings.draft_n {t['draft_n']} (more " \
               "drafts accepted than drafted)"
    if t["draft_n_accepted"] > t["predicted_n"]:
        return f"timings.draft_n_accepted {t['draft_n_accepted']} above timings.predicted_n {t['predicted_n']} " \
               "(more drafts accepted than tokens generated)"
    if n_predict is not None and n_predict > 0 and t["predicted_n"] > n_predict:
        return f"timings.predicted_n {t['predicted_n']} above the n_predict {n_predict} asked"
    return token_fault(t)


def token_fault(t: dict) -> str | None:
    """What is wrong with a response's output token ids (t["tokens"]; None: an older record without them): a list
    of whole numbers, as many as timings.predicted_n."""
    toks = t.get("tokens")
    if toks is None:
        return None
    if not isinstance(toks, list):
        return f"tokens {str(toks)[:40]!r} (not a list of token ids)"
    bad = next((x for x in toks if isinstance(x, bool) or not isinstance(x, int) or x < 0), None)
    if bad is not None or None in toks:
        return f"tokens holding {bad!r} (token ids are whole numbers from 0)"
    if len(toks) != t["predicted_n"]:
        return f"{len(toks)} tokens for timings.predicted_n {t['predicted_n']} (they must be equal)"
    return None


def row_fault(row: dict) -> str | None:
    """fault() of the first response in a stored row (crosscheck.json) that is not a measurement, with its prompt
    and server."""
    for p in row.get("prompts") or []:
        p = p if isinstance(p, dict) else {"id": repr(p)}
        for role in ("plain", "speculative"):
            t = p.get(role)
            why = fault(t, p.get("max_tokens")) if isinstance(t, dict) else "no timings"
            if why:
                return f"prompt {p.get('id')}, {role}: {why}"
    return None


def rate(t: dict | None) -> float | None:
    """Tokens per ms of one response's timings, as llama-server counts its predicted_per_second."""
    if not t:
        return None
    n, ms = t.get("predicted_n") or 0, t.get("predicted_ms") or 0.0
    return (n - 1) / ms if n > 1 and ms > 0 else None


def ratios(prompts: list[dict]) -> list[float]:
    """Per prompt, speculative rate over plain rate (prompts where either generated under two tokens drop out)."""
    out = []
    for p in prompts:
        a, b = rate(p.get("speculative")), rate(p.get("plain"))
        if a and b:
            out.append(a / b)
    return out


def speedup(prompts: list[dict], level: float = LEVEL) -> dict:
    """{"speedup", "lo", "hi", "prompts"}: the geometric mean of the per-prompt ratios and its t interval."""
    r = ratios(prompts)
    n = len(r)
    if not n:
        return {"speedup": None, "lo": None, "hi": None, "prompts": 0}
    logs = [math.log(x) for x in r]
    mean = sum(logs) / n
    x = math.exp(mean)
    if n < 2:
        return {"speedup": x, "lo": None, "hi": None, "prompts": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    lo, hi = interval(x, sd / math.sqrt(n), n, level, log=True)
    return {"speedup": x, "lo": lo, "hi": hi, "prompts": n}


def acceptance(prompts: list[dict], level: float = LEVEL) -> dict:
    """{"acceptance", "acceptance_lo", "acceptance_hi", "drafted", "accepted"} of the speculative server."""
    pairs = [((p.get("speculative") or {}).get("draft_n_accepted") or 0, (p.get("speculative") or {}).get("draft_n")
              or 0) for p in prompts if p.get("speculative")]
    acc, drafted = sum(a for a, _ in pairs), sum(d for _, d in pairs)
    out = {"acceptance": None, "acceptance_lo": None, "acceptance_hi": None, "drafted": drafted, "accepted": acc}
    if not drafted:
        return out
    r, n = acc / drafted, len(pairs)
    out["acceptance"] = r
    if n >= 2:
        mean_d = drafted / n
        se = math.sqrt(sum((a - r * d) ** 2 for a, d in pairs) / (n * (n - 1))) / mean_d
        lo, hi = interval(r, se, n, level)
        out["acceptance_lo"], out["acceptance_hi"] = max(lo, 0.0), min(hi, 1.0)
    return out


def reading(lo: float | None, hi: float | None, min_gain: float) -> str:
    """What llama.cpp's interval alone says, by the rule in the module's docstring."""
    if lo is None or hi is None:
        return INCONCLUSIVE
    if lo > 1 + min_gain:
        return SPECULATE
    if hi < 1:
        return PLAIN
    if hi < 1 + min_gain:
        return NO_GAIN
    return INCONCLUSIVE


def holds(verdict: str, lo: float | None, hi: float | None, min_gain: float) -> str:
    """Whether the harness's `verdict` holds on llama.cpp's interval: holds, contradicted, unsettled, or - (an
    inconclusive verdict, which claims nothing)."""
    if verdict not in (SPECULATE, NO_GAIN, PLAIN):
        return NOT_CHECKED
    if lo is None or hi is None:
        return UNSETTLED
    bar = 1 + min_gain
    yes, no = {SPECULATE: (lo > bar, hi < bar), NO_GAIN: (hi < bar, lo > bar), PLAIN: (hi < 1, lo > 1)}[verdict]
    return HOLDS if yes else CONTRADICTED if no else UNSETTLED


def same_outputs(prompts: list[dict]) -> tuple[int, int]:
    """(equal, compared): prompts whose speculative and plain outputs (token ids) are the same."""
    both = [p for p in prompts if (p.get("speculative") or {}).get("tokens") is not None
            and (p.get("plain") or {}).get("tokens") is not None]
    return sum(p["speculative"]["tokens"] == p["plain"]["tokens"] for p in both), len(both)


def figures(prompts: list[dict], verdict: str, min_gain: float) -> dict:
    """Everything a row shows of llama.cpp: speedup and acceptance with intervals, its reading, holds."""
    s = speedup(prompts)
    return s | acceptance(prompts) | {"reading": reading(s["lo"], s["hi"], min_gain),
                                      "holds": holds(verdict, s["lo"], s["hi"], min_gain)}
