"""The report's replay sections: verdicts predicted from every prompt, acceptance apart from cost (models,
prompts and policy only), the predicted speedup that combines it with this machine's cost, and the two
verification rules side by side. Its cost, adaptive gamma and the timed runs that check it are diagnostics
(report.diagnostics)."""
from __future__ import annotations

from dataclasses import replace

import polars as pl

from harness.analysis.verdict import (BEYOND, BUSY, INCONCLUSIVE, MIN_GAIN, NO_GAIN, PLAIN, SPECULATE, Evidence,
                                      decide)
from harness.report.fmt import beside, ci, table
from harness.report.verdicts import LEVEL_BUSY, speculated
from harness.specs import parse_draft

GROUP = ["target", "ngl", "threads", "setup", "policy", "category"]
SHOWN_GAMMAS = (1, 2, 4, 8)


# How far a prediction may pass its bound (analysis.predict.speedup_bound) before it is a defect of its inputs:
# the plain pace it is levelled to and the replay's own decode, minutes apart, differ without anything being
# wrong. Over the 216 predicted groups of the 15 committed replayed runs the most was 1.22x (run 20261201-155230-vm);
# the busy baseline of the trust issue gave 2.7x and 1.5x (docs/methodology.md#verdicts-you-can-trust).
BOUND_SLACK = 0.25
MIN_CONFIRM = 3  # a timed check of fewer prompts is consistent at best: one prompt's luck is no confirmation


def predicted_verdicts(r: pl.DataFrame, min_gain: float = MIN_GAIN, group: list[str] = GROUP) -> pl.DataFrame:
    """Per group, the verdict over every (proposer, gamma) the replay predicted, and the timed run of the
    configuration it names, where there is one. No verdict (BUSY) where the replay's costs were measured on a
    busy machine; none (BEYOND) where a prediction passes what its own measured costs allow at any acceptance."""
    rows = []
    for key, g in r.group_by(group, maintain_order=True):
        g = speculated(g, "proposed").with_row_index("_i")
        ev = [Evidence(str(x["_i"]), x["speedup"], x["speedup_se"], x["prompts"]) for x in g.iter_rows(named=True)]
        v = decide(ev, min_gain=min_gain)
        if v.chosen is None:
            continue
        x = g.row(int(v.chosen.config), named=True)
        kind, why = _defect(g)
        if kind:
            v = replace(v, kind=kind, why=why)
        rows.append(dict(zip(group, key)) | {"verdict": v.kind, "proposer": x["proposer"], "gamma": x["gamma"],
                                             "adaptive": x["adaptive"],
                                             "speedup": x["speedup"], "lo": v.lo, "hi": v.hi, "adjusted": v.adjusted,
                                             "k": v.k, "prompts": x["prompts"], "further": v.further, "kind": x["kind"],
                                             "min_gain": v.min_gain, "at_most": v.at_most, "why": v.why,
                                             "draft": x["draft"], "verify": x["verify"], "base": x.get("base"),
                                             "timed": x.get("timed_speedup"), "timed_lo": x.get("timed_speedup_lo"),
                                             "timed_hi": x.get("timed_speedup_hi"),
                                             "timed_prompts": x.get("timed_prompts"),
                                             "accepted_len": x.get("mean_accepted_len"),
                                             "levelled": g["levelled"][0] if "levelled" in g.columns else None})
    return pl.DataFrame(rows, infer_schema_length=None)


def best_fixed(pred: pl.DataFrame, r: dict, base: str = "base") -> dict | None:
    """The prediction row of the best fixed gamma for a verdict's draft and rule (r, a predicted_verdicts row; base:
    the column naming its plain baseline): what llama.cpp, which cannot adapt gamma, runs for an adaptive one."""
    rule = pl.col("verify").fill_null("leviathan") == (r["verify"] or "leviathan")
    fixed = pred.filter((pl.col(base) == r[base]) & (pl.col("category") == r["category"])
                        & (pl.col("draft") == r["draft"]) & ~pl.col("adaptive") & rule)
    return fixed.sort("speedup", descending=True).row(0, named=True) if len(fixed) else None


def _defect(g: pl.DataFrame) -> tuple[str, str]:
    """(kind, why) where a group's predictions cannot carry a verdict: its replay ran busy, or a prediction passes
    its bound; ("", "") otherwise."""
    busy = g.filter(pl.col("levelled") == LEVEL_BUSY) if "levelled" in g.columns else g.clear()
    if len(busy):  # busy_why: where the costs came from elsewhere (a calibration)
        return BUSY, (busy["busy_why"][0] if "busy_why" in g.columns else "the replay ran while other processes "
                      "used the CPU") + ": its decode costs are not this machine's"
    if "bound" not in g.columns:  # runs from before the bound
        return "", ""
    over = g.filter(pl.col("speedup") > pl.col("bound") * (1 + BOUND_SLACK))
    if not len(over):
        return "", ""
    x = over.sort(pl.col("speedup") / pl.col("bound"), descending=True).row(0, named=True)
    return BEYOND, (f"{x['proposer']} γ {x['gamma']} was predicted {x['speedup']:.2f}x, beyond the {x['bound']:.2f}x "
                    "its own measured costs allow at any acceptance: the plain pace it was levelled to is not this "
                    "machine's")


def confirmation(r: dict) -> str:
    """Whether the timed run of the named configuration agrees: confirmed when its interval lies on the verdict's
    side of the verdict's bar (1 for plain decoding, 1 + the least gain for the others), CONTRADICTED when it lies
    wholly on the other side, consistent otherwise (too few timed prompts to tell; for an open verdict, when the
    two intervals meet)."""
    if r["timed"] is None:
        return "not timed"
    if r["timed_lo"] is None:
        return f"timed {r['timed']:.2f}x (one prompt)"
    n = r.get("timed_prompts")
    few = n is not None and n < MIN_CONFIRM  # shown without an interval, and never "confirmed"
    timed = f"{r['timed']:.2f}x on {n} prompt{'s' * (n > 1)}" if few else ci(r["timed"], r["timed_lo"], r["timed_hi"],
                                                                             unit="x")
    if r["verdict"] not in (PLAIN, NO_GAIN, SPECULATE):  # nothing settled to confirm: do the two intervals meet
        agrees = r["timed_lo"] <= r["hi"] and r["lo"] <= r["timed_hi"]
        return ("consistent: " if agrees else "NOT consistent: ") + timed
    bar = 1 if r["verdict"] == PLAIN else 1 + (r.get("min_gain") or 0)
    below, above = r["timed_hi"] < bar, r["timed_lo"] > bar
    right, wrong = (above, below) if r["verdict"] == SPECULATE else (below, above)
    return ("confirmed: " if right and not few else "CONTRADICTED: " if wrong else "consistent: ") + timed


def settle(r: dict) -> str:
    """What a verdict line says of its claim: the bound that settled it, or the prompts that would."""
    if r["verdict"] == NO_GAIN:
        return f"all <= {beside(r['at_most'], 1 + r['min_gain'])}x (< {1 + r['min_gain']:.2f})"
    if r["verdict"] == SPECULATE:
        return f"> {1 + r['min_gain']:.2f}x"
    if r["verdict"] == PLAIN:
        return "all < 1"
    if r["verdict"] == INCONCLUSIVE:
        return "out of reach" if r["further"] is None else f"~{r['further']} more prompt{'s' * (r['further'] > 1)}"
    return ""


def per_target(frame: pl.DataFrame, lines_of) -> list[str]:
    """lines_of(frame), or, where the run has several targets, lines_of each target's part under its name: the
    same category, policy and proposer recur with each target, and a column of long names would widen the table."""
    if "target" not in frame.columns or frame["target"].n_unique() < 2:
        return lines_of(frame)
    return [x for t in frame["target"].unique(maintain_order=True)
            for x in [f"Target `{t}`:", "", *lines_of(frame.filter(pl.col("target") == t))]]


def verdict_table(data: dict[str, pl.DataFrame]) -> list[str]:
    """The verdicts predicted from every prompt, a row per group (under its target's name where the run has
    several): the first screen's table of a run with a replay."""
    r, v = data.get("replay"), data.get("replay_verdicts")
    if r is None or not len(r) or v is None or not len(v):
        return []
    several = v["target"].n_unique() > 1
    rows = [([t] if several else []) + [
        x["category"], x["policy"], f"{x['proposer']} g={'auto<=' if x['adaptive'] else ''}{x['gamma']}",
        ci(x["speedup"], x["lo"], x["hi"], unit="x") + ("*" if x["adjusted"] else ""), x["verdict"], x["prompts"],
        settle(x), confirmation(x)]
        for t in v["target"].unique(maintain_order=True) for x in v.filter(pl.col("target") == t).iter_rows(named=True)]
    return ["## Predicted from every prompt (replay)",
            table(rows, (["target"] if several else []) + ["category", "policy", "best predicted", "speedup [95% CI]",
                                                           "verdict", "prompts", "settled by", "timed run"]), ""]


def verdict_rules(data: dict[str, pl.DataFrame], plan: dict) -> list[str]:
    """How the predicted verdicts are reached, under their table's name; for a run without a replay, that its
    verdicts rest on the timed configurations alone."""
    r, v = data.get("replay"), data.get("replay_verdicts")
    if r is None or not len(r):
        if plan.get("params", {}).get("replay"):
            return []
        return ["This run has no replay (it predates it, or ran without --replay): the verdicts rest on the timed "
                "configurations alone.", ""]
    if v is None or not len(v):
        return []
    own = pl.col("draft").is_in(list(_own_gamma(r)))
    swept, k_own = r.filter(~own), r.filter(own)["proposer"].n_unique()
    gm = int((swept if len(swept) else r)["gamma"].max())
    tried = [f"{swept['proposer'].n_unique()} proposers x {gm} gammas"] * bool(len(swept)) + \
        [f"{k_own} of llama.cpp's n-gram types at their own gamma"] * bool(k_own)
    gain = f"{v['min_gain'][0]:.0%}"
    return ["**Predicted from every prompt (replay).** "
            "Each plain baseline's outputs were teacher-forced through every draft (and the n-gram proposals "
            "recomputed from the same contexts): under greedy decoding (and llama.cpp's exact rule, whose outputs "
            f"are the plain ones) this gives the exact steps of speculative decoding at every gamma up to {gm} "
            "(exact up to kernel near-ties); under sampling with Leviathan's rule, the probability of acceptance at "
            "each position (alpha = sum min(p, q) along the target's own output), from which the *expected* steps "
            "follow. With the decode costs measured beside the replay, levelled to each category's measured plain "
            "speed, that predicts the speedup of every configuration from every prompt. The verdicts follow the rule "
            f"above (95%) at a least gain worth having of {gain}, over all "
            f"{' and '.join(tried)} of a group (widened for speculate, *). "
            "Settled by: the bound that settled the claim, or the further prompts that would settle the likeliest "
            "verdict with 80% probability. Timed run: the named configuration, timed; confirmed when its interval "
            "lies on the verdict's side of its bar, CONTRADICTED when it lies wholly on the other side, consistent "
            "otherwise (for an open verdict, when the two intervals meet).", ""]


def sections(data: dict[str, pl.DataFrame], plan: dict) -> list[str]:
    """The replay's part of the report: the two verification rules side by side (acceptance and the predicted
    speedup of every proposer and gamma are the diagnostics' detail, as are its costs, adaptive gamma and its
    agreement with the timed runs)."""
    r = data.get("replay")
    if r is None or not len(r):
        if plan.get("params", {}).get("replay"):
            return ["## Replay", "", "The replay did not finish (see the configurations that did not finish).", ""]
        return []
    return _rules(r.filter(~pl.col("adaptive")))


def detail(data: dict[str, pl.DataFrame]) -> list[str]:
    """Acceptance and the predicted speedup of every proposer and gamma (the diagnostics')."""
    r = data.get("replay")
    if r is None or not len(r):
        return []
    fixed = r.filter(~pl.col("adaptive"))
    return _acceptance(fixed) + _speedup(fixed)


def _acceptance(r: pl.DataFrame) -> list[str]:
    """Acceptance depends on the models, the prompts and the policy only: not on this machine."""
    own = sorted(set(_own_gamma(r).values()) - set(SHOWN_GAMMAS))
    shown = sorted([*SHOWN_GAMMAS, *own])

    def rows(r: pl.DataFrame) -> list[str]:
        out = []
        for (cat, pol, prop), g in r.group_by(["category", "policy", "proposer"], maintain_order=True):
            by = {x["gamma"]: x for x in g.iter_rows(named=True)}
            low = by[min(by)]  # gamma 1; an n-gram type of llama.cpp's has its own alone
            out.append([cat, pol, prop, low["kind"], ci(low["alpha"], low["alpha_lo"], low["alpha_hi"], ".3f")]
                       + [ci(by[k]["mean_accepted_len"], by[k]["mean_accepted_len_lo"], by[k]["mean_accepted_len_hi"])
                          if k in by else "" for k in shown])
        return [table(out, ["category", "policy", "proposer", "kind", "alpha"]
                      + [f"accepted/step g={k}" for k in shown]), ""]
    return ["## Acceptance (models, prompts and policy only)", "",
            "alpha: per position (greedy: the rate at which the draft's proposal matches the output); mean accepted "
            "drafts per verification step at gamma 1, 2, 4, 8" + (", and llama.cpp's n-gram types' at their own"
                                                                   if own else "")
            + ". Exact under greedy, expected under sampling.", "", *per_target(r, rows)]


def _speedup(r: pl.DataFrame) -> list[str]:
    def rows(r: pl.DataFrame) -> list[str]:
        out = []
        for (cat, pol, prop), g in r.group_by(["category", "policy", "proposer"], maintain_order=True):
            best = g.sort("speedup", descending=True).row(0, named=True)
            one = g.filter(pl.col("gamma") == 1).rows(named=True)  # none for llama.cpp's n-gram types
            out.append([cat, pol, prop, best["gamma"], ci(best["speedup"], best["speedup_lo"], best["speedup_hi"],
                                                         unit="x"),
                        ci(one[0]["speedup"], one[0]["speedup_lo"], one[0]["speedup_hi"], unit="x") if one else ""])
        return [table(out, ["category", "policy", "proposer", "best gamma", "at best gamma", "at gamma 1"]), ""]
    return ["## Predicted speedup (acceptance and cost combined)", "", *per_target(r, rows)]


def _own_gamma(r: pl.DataFrame) -> dict[str, int]:
    """{draft: gamma} of the drafts predicted at their own gamma alone (llama.cpp's n-gram types)."""
    return {d: g for d in r["draft"].unique() if (g := parse_draft(d).own_gamma)}


def _rules(r: pl.DataFrame) -> list[str]:
    """Leviathan's rule beside llama.cpp's, per draft, where the replay predicted both (sampled policies)."""
    if "verify" not in r.columns or r["verify"].n_unique() < 2:
        return []

    def rows(r: pl.DataFrame) -> list[list]:
        out = []
        for (cat, pol, draft), g in r.group_by(["category", "policy", "draft"], maintain_order=True):
            rules = {v: g.filter(pl.col("verify") == v) for v in ("leviathan", "exact")}
            if any(not len(x) for x in rules.values()):
                continue
            one = {v: x.filter(pl.col("gamma") == 1).row(0, named=True) for v, x in rules.items()}
            best = {v: x.sort("speedup", descending=True).row(0, named=True) for v, x in rules.items()}
            out.append([cat, pol, draft] + [ci(one[v]["alpha"], one[v]["alpha_lo"], one[v]["alpha_hi"], ".3f")
                                            for v in rules]
                       + [f"g={best[v]['gamma']}: " + ci(best[v]["speedup"], best[v]["speedup_lo"],
                                                         best[v]["speedup_hi"], unit="x") for v in rules])
        return out

    if not rows(r):
        return []
    return ["## Verification rules (replayed)", "",
            "Acceptance per position and the best predicted speedup under Leviathan's rejection sampling (a draft "
            "sampled from q, accepted with probability sum min(p, q)) and llama.cpp's rule (the draft's top token, "
            "accepted when the target samples it: probability p of that token), from the same passes.", "",
            *per_target(r, lambda r: [table(rows(r), ["category", "policy", "draft", "alpha leviathan",
                                                      "alpha exact", "best leviathan", "best exact"]), ""])]
