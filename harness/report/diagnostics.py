"""diagnostics.md, written in the run directory beside the traces: the harness's checks of itself, apart from the
report a user reads (report.render links to it in one line). Does the harness predict its own timings: the replay
on the very prompts the timed runs used against their timing, the replay's costs (measured twice: how far they
moved), adaptive gamma against the best fixed gamma, the cost model against every timed row, the batched cost
model against every concurrent one; how far the machine moves by itself (two timings of the same work, the pace's
spread between a generation and its twin, the plain baselines' drift, other processes' load); whether greedy
speculative output is plain decoding's; every timed row, per category; and the detail behind the report's
tables (acceptance and predicted speedup of every proposer and gamma, the timed rows per draft). `harness report`
writes it with the report, and --check and `harness archive` check it as they check the report."""
from __future__ import annotations

import os
import statistics
from pathlib import Path

import polars as pl

from harness.analysis.metrics import pace_spread
from harness.report import concurrency, sections
from harness.report.fmt import ci, contents, f, table
from harness.report.replayed import detail as replayed_detail
from harness.report.replayed import per_target
from harness.rundir import read_plan

DIAGNOSTICS = "diagnostics.md"
CHECK_PLOTS = ("cost_model.png", "calibration.png")  # sections.PLOTS that show the harness's checks of itself
TITLE = "# Does the harness predict its own timings?"


def render_diagnostics(run_dir: Path, data: dict[str, pl.DataFrame], report: Path) -> str:
    """The diagnostics of run_dir, to be written in it as DIAGNOSTICS (paths in it are relative to run_dir);
    report: where the run's report is, which it links back to."""
    plan = read_plan(run_dir)
    back = Path(os.path.relpath(report.resolve(), run_dir.resolve())).as_posix()
    head = [TITLE, "", f"The checks the harness makes of itself in run {run_dir.name}, apart from "
            f"[its report]({back}), which gives the answer: how closely its predictions follow its own timings, how "
            "far the machine moved by itself, whether greedy speculative output is plain decoding's; and every "
            "timed row.", ""]
    sweep = data.get("sweep")
    if sweep is None or not len(sweep):
        return "\n".join(head + ["No configuration finished.", ""])
    replay = data.get("replay")
    replayed = replay is not None and len(replay) > 0
    body = (_timed(data) if replayed else []) + \
        _against_timed(data.get("replay_same"), data.get("equivalence"), data.get("timing_floor")) + \
        (_costs(data.get("replay_costs")) + _adaptive(replay) if replayed else []) + \
        cost_model(data) + concurrency.agreement_section(data) + noise(data, plan) + drift(sweep) + \
        equivalence(data.get("equivalence"), data["configs"]) + sections.per_category(sweep) + \
        replayed_detail(data) + sections.quantization(sweep, data.get("fidelity")) + \
        sections.plots(run_dir, run_dir, CHECK_PLOTS)
    return "\n".join(head + contents(head, body) + body)


def _timed(data: dict[str, pl.DataFrame]) -> list[str]:
    """The timed configurations' own verdicts, in a run whose answer is predicted from every prompt: the
    predicted verdicts rest on none of them, and the named configuration's timed run checks each."""
    table_ = sections.timed_verdicts(data.get("verdicts"))
    if not table_:
        return []
    return [table_[0], "", "The timed subset's verdicts by the same rule, each on the prompts its configurations ran "
            "(the report's answer is predicted from every prompt; its last column is this check, configuration by "
            "configuration).", "", *table_[1:]]


def _against_timed(t: pl.DataFrame | None, eq: pl.DataFrame | None, floor: pl.DataFrame | None) -> list[str]:
    """The replay on the prompts a timed run used, against that run: acceptance and speedup, like for like."""
    if t is None or not len(t):
        return []
    ties = {} if eq is None or not len(eq) else {(r["config"], r["category"]): r["kernel_near_ties"]
                                                for r in eq.iter_rows(named=True)}

    def rows(t: pl.DataFrame) -> list[str]:
        out = [[x["category"], x["policy"], x["proposer"], x["gamma"], x["timed_prompts"],
                f(x["acceptance_rate"], ".0%"), f(x["timed_acceptance_rate"], ".0%"),
                ties.get((x["timed_config"], x["category"]), "") if x["policy"] == "greedy" else "",
                ci(x["speedup"], x["speedup_lo"], x["speedup_hi"], unit="x"),
                ci(x["timed_speedup"], x["timed_speedup_lo"], x["timed_speedup_hi"], unit="x"),
                f(x["speedup"] / x["timed_speedup"] - 1, "+.0%")]
               for x in t.sort(["category", "policy", "proposer", "gamma"]).iter_rows(named=True)]
        return [table(out, ["category", "policy", "proposer", "gamma", "prompts", "acceptance (replayed)", "(timed)",
                            "near-ties", "speedup (predicted)", "(measured)", "error"]), ""]

    def close(col: str) -> int:
        return sum(abs(x[col] / x["timed_speedup"] - 1) <= 0.10 for x in t.iter_rows(named=True) if x[col])
    meet = sum(x["speedup_lo"] is not None and x["timed_speedup_lo"] is not None
               and x["speedup_lo"] <= x["timed_speedup_hi"] and x["timed_speedup_lo"] <= x["speedup_hi"]
               for x in t.iter_rows(named=True))
    level = ("The predicted speedup prices plain decoding at the pace of the configuration's own plain twins, which "
             "alternated with its generations: the replay takes plain decoding's speed as measured and predicts "
             "what speculation costs against it. ") if t["at_twins"].all() else ""
    drift = (f" At the plain baselines' pace instead, measured minutes earlier (as the verdicts price it), "
             f"{close('speedup_at_baseline')} of {len(t)}: the difference is the machine's drift between the "
             "two.") if level else ""
    own = t["speedup_own_costs"].drop_nulls() if "speedup_own_costs" in t.columns else []
    if len(own):
        drift += (f" Priced instead with each timed configuration's own decode costs (measured in its worker before "
                  "and after its generations, minutes after the replay's, with fewer repetitions): "
                  f"{close('speedup_own_costs')} of {len(own)}. What that changes is the machine's drift between the "
                  "replay's moment and the timed one, which costs measured at another moment cannot know; what "
                  "remains is the cost model's error, the costs' own noise and, under sampling, the draw's.")
    return ["## Replayed against timed", "",
            "The replay on the very prompts each timed configuration ran, against that run. Under greedy decoding "
            "the two acceptances are equal up to kernel near-ties: where the timed run left plain decoding (near-"
            "ties, counted), and where the draft's own top two choices were nearly tied (the loop builds its cache "
            "in blocks of one or two tokens as acceptance falls, the replay one token at a time). Under sampling "
            f"the replay gives the expectation, the timed run one draw. {level}Speedup predicted within 10% of "
            f"measured in {close('speedup')} of {len(t)} rows; the two intervals meet in {meet}.{drift}"
            f"{timing_floor(floor)}",
            "", *per_target(t, rows)]


def timing_floor(fl: pl.DataFrame | None) -> str:
    """How closely two timings of the same work agree in this run (metrics.timing_floor): how far a timed row
    moves by itself, which no prediction can follow."""
    if fl is None or not len(fl):
        return ""
    off = (fl["ratio"] - 1).abs()
    return (" Two timings of the same work, seconds apart, show how far a timed row moves by itself: the "
            "target's one-token decodes in the steps of speculative generations that proposed nothing "
            f"and those of their plain twins ran within 10% of each other in {int((off <= 0.10).sum())} of "
            f"{len(off)} generations, within 5% in {int((off <= 0.05).sum())} (median difference {off.median():.1%}). "
            f"Beyond their decodes' own scatter, the pace moved by {pace_spread(fl):.1%} (log-scale spread) between "
            "a generation and its twin, which the intervals of rows timed on one prompt carry.")


def _costs(c: pl.DataFrame | None) -> list[str]:
    """Cost depends on this machine only: the target's verification blocks against one decode, the draft's."""
    if c is None or not len(c):
        return []
    def rows(c: pl.DataFrame) -> list[str]:
        out = []
        for x in c.iter_rows(named=True):
            for ctx, t, d in zip(x["contexts"], x["target_ms_by_context"], x["draft_ms_by_context"]):
                out.append([x["policy"], x["proposer"], ctx, f(t[0], ".1f")]
                           + [f(t[k - 1] / t[0], ".2f") + "x" if k <= len(t) else "" for k in (2, 3, 5, 9)]
                           + [f(d[0], ".2f") if d else ""])
        return [table(out, ["policy", "proposer", "cached tokens", "target ms", "k=2", "k=3", "k=5", "k=9",
                            "draft ms"]), ""]
    return ["## Cost (this machine only)", "",
            "Measured beside the replay, with the prompts' own text in the cache: one target decode, a verification "
            "block of k tokens against it, and one draft decode (an n-gram lookup's own time)." + _moved(c), "",
            *per_target(c, rows)]


def _moved(c: pl.DataFrame) -> str:
    """What the two moments of the replay's costs say of the machine's drift (runs from before: nothing)."""
    if "moved" not in c.columns:
        return ""
    by_target = c.unique("config", keep="first", maintain_order=True)["moved"].drop_nulls()
    ms = [abs(x) for xs in by_target for x in xs]
    if not ms:
        return ""
    return (f" Each was measured twice, before the replay's prompts and after them, and the two pooled: between "
            f"the two moments the target's blocks moved by a median of {statistics.median(ms):.0%} and up to "
            f"{max(ms):.0%}. The medians sit between the two moments; the spread is in the intervals.")


def _adaptive(r: pl.DataFrame) -> list[str]:
    """The adaptive controller replayed (greedy, draft models): against the best fixed gamma."""
    auto = r.filter(pl.col("adaptive"))
    if not len(auto):
        return []

    def rows(auto: pl.DataFrame) -> list[str]:
        out = []
        for x in auto.iter_rows(named=True):
            fixed = r.filter(~pl.col("adaptive") & (pl.col("base") == x["base"])
                             & (pl.col("category") == x["category"]) & (pl.col("proposer") == x["proposer"])
                             ).sort("speedup", descending=True).row(0, named=True)
            bar = max(fixed["speedup"], 1.0)
            out.append([x["category"], x["proposer"], ci(x["speedup"], x["speedup_lo"], x["speedup_hi"], unit="x"),
                        f"{fixed['gamma']}: " + ci(fixed["speedup"], fixed["speedup_lo"], fixed["speedup_hi"],
                                                   unit="x"),
                        f(x["speedup"] / bar, ".2f")])
        return [table(out, ["category", "proposer", "auto", "best fixed gamma", "auto / max(best fixed, plain)"]),
                ""]
    return ["## Adaptive gamma (greedy, replayed)", "",
            "The controller (`--gamma auto`) run over the replayed acceptances with the measured costs, choosing "
            "gamma per step up to the replay's largest (0: a plain step), against the best fixed gamma and plain "
            "decoding (1.00x); its goal is to be within 5% of the better of the two.", "", *per_target(auto, rows)]


def cost_model(data: dict[str, pl.DataFrame]) -> list[str]:
    cm = data.get("cost_model")
    if cm is None or not len(cm):
        return []
    rows = [[r["category"], r["policy"], r["draft_label"], r["gamma_label"], f(r["alpha"], ".3f"),
             f(r["predicted"]) + ("x" if r["predicted"] is not None else ""), f(r["speedup"]) + "x",
             f(r["error"], "+.0%"), "" if r["tokens_per_call_rse"] is None else f"±{r['tokens_per_call_rse']:.0%}"]
            for r in cm.iter_rows(named=True)]
    rec = [[r["category"], r["policy"], r["draft"], r["gamma"] or "0 (plain)"]
           for r in data["recommended"].iter_rows(named=True)]
    auto = data.get("adaptive")
    auto_rows = [[r["category"], r["policy"], r["draft"], f(r["auto"]) + "x", f(r["best_fixed"]) + "x",
                  f(r["ratio"], ".2f"), "yes" if r["within_5pct"] else "NO"]
                 for r in (auto.iter_rows(named=True) if auto is not None else [])]
    return ["## Cost model", "",
            "Predicted speedup = E * T_target(1) / (gamma * T_draft(1) + T_verify(gamma+1) + overhead), "
            "E = (1 - alpha^(gamma+1)) / (1 - alpha) (Leviathan et al. 2023), mixed with plain steps in the share "
            "of steps that proposed nothing (the end of a generation; an n-gram lookup that found no match), with "
            "the decode costs measured in "
            + ("the row's worker before its generations and after them, the two pooled "
               if cm["pooled"].any() else "the row's worker seconds before its generations ")
            + "(the target's blocks with all logits, the draft's "
            "decodes with the last row's; runs from before that use the run's calibration, `calibration/`, "
            "interpolated to the row's mean context length), scaled so that T_target(1) is the row's measured plain "
            "decode, and the row's measured alpha and per-step overhead. "
            "s.e. is the relative standard error of the row's measured tokens per target call, from its "
            "step-to-step spread: how far the acceptance draws of a short run move the measured speedup on their "
            "own (the prediction uses alpha, which under sampling is an expectation and steadier; under greedy the "
            "same draws set both); an error within about two of them is sampling noise.",
            "", _agreement(cm, data.get("timing_floor")), "",
            table(rows, ["category", "policy", "draft", "gamma", "alpha", "predicted", "measured", "error", "s.e."]),
            ""] + ([
            "Recommended gamma (the cost model's best at the measured alpha over the whole measured curve; 0 = "
            "plain decoding):", "",
            table(rec, ["category", "policy", "draft", "gamma"]), ""] if rec else []) + ([
            "Adaptive gamma against the better of the best fixed gamma and plain decoding (speedup 1.00x), same "
            "run; the goal is to be within 5% of it:", "",
            table(auto_rows, ["category", "policy", "draft", "auto", "best fixed", "auto / max(best fixed, plain)",
                               "within 5%"]), ""] if auto_rows else [])


def _agreement(cm: pl.DataFrame, floor: pl.DataFrame | None) -> str:
    err = cm["error"].cast(pl.Float64).drop_nulls().abs()  # all null (no baseline finished): no dtype to abs
    if not len(err):
        return "No row has both a prediction and a measurement."
    return (f"Predicted within 10% of measured in {int((err <= 0.1).sum())} of {len(err)} rows "
            f"(mean absolute error {err.mean():.1%}).{timing_floor(floor)}")


def noise(data: dict[str, pl.DataFrame], plan: dict) -> list[str]:
    """Foreign load per configuration and the spread of the plain speeds it was compared with."""
    nz = data.get("noise")
    if nz is None or not len(nz) or "foreign_max" not in nz.columns:
        return []
    cfg = data["configs"]
    n = nz.join(cfg.select("config", "draft_label", "gamma_label", "policy"), on="config", how="left")
    paired = "plain_vs_run" in n.columns
    rows = [[r["draft_label"], r["gamma_label"], r["policy"], f(r["foreign_mean"], ".1%"), f(r["foreign_max"], ".1%"),
             f(r["load1"], ".2f")]
            + ([ci(r["plain_vs_run"], r["plain_vs_run_min"], r["plain_vs_run_max"])] if paired else [])
            + ["BUSY" if r["busy"] else ""]
            for r in n.iter_rows(named=True) if r["foreign_max"] is not None]
    idle = plan.get("idle_check") or {}
    lines = ["## Machine noise", "",
             "Other processes' share of all cores while each configuration ran (mean, and the worst 10 seconds), "
             "sampled every second from the machine's CPU counters less this benchmark's own; the 1-minute load "
             "average (this run's threads included) at "
             "its end; in a paired run, how fast its plain twins ran against the same prompts' plain twins over the "
             "whole run (median ratio [lowest, highest]): below 1, it ran in a slow spell. A "
             f"configuration is busy when any 10 seconds passed the threshold ({f(idle.get('threshold'), '.0%')} of "
             "the cores): llama.cpp's spinning threads make even a little sustained foreign load cost a lot, so no "
             "verdict rests on a busy one."]
    if idle:
        lines[-1] += (f" Before the sweep: {f(idle.get('foreign'), '.1%')} of {idle.get('cores')} cores"
                      + (" (busy; run with --allow-busy)" if idle.get("busy") else "") + ".")
    return lines + ["", table(rows, ["draft", "gamma", "policy", "foreign load", "worst 10 s", "load avg (all)"]
                              + (["plain speed vs run"] if paired else []) + ["busy"]), ""]


def drift(sweep: pl.DataFrame) -> list[str]:
    if "drift" not in sweep.columns:
        return []
    base = sweep.filter((pl.col("draft") == "none") & pl.col("drift").is_not_null()).sort(
        pl.col("policy") != "greedy", "policy", maintain_order=True)
    if not len(base):
        return []
    rng = sweep.filter(pl.col("paired_tokens_per_s").is_not_null()).group_by(["category", "policy"]).agg(
        pl.col("paired_tokens_per_s").min().alias("lo"), pl.col("paired_tokens_per_s").max().alias("hi"))
    base = base.join(rng, on=["category", "policy"], how="left")
    paired = base["lo"].is_not_null().any()
    rows = [[r["category"], r["policy"], f(r["base_tokens_per_s"], ".2f"), f(r["base_end_tokens_per_s"], ".2f"),
             f(r["drift"], ".3f")] + ([f"{f(r['lo'], '.2f')}-{f(r['hi'], '.2f')}"] if paired else [])
            for r in base.iter_rows(named=True)]
    worst = max(abs(d - 1) for d in base["drift"])
    text = ("The plain baselines ran again after every other configuration; the two differ by up to "
            f"{worst:.1%} here. ")
    if paired:
        text += ("Speedups are against the plain runs paired with each configuration in its worker, so this "
                 "drift is not in them; the last column is the range of those paired plain speeds over the run.")
    else:
        text += ("Speedups are against the plain baselines at the start, and their intervals do not hold this "
                 "drift: a speedup within it of 1.00x may be the machine's doing (rerun with --paired, as every "
                 "profile does).")
    return ["## Drift", "", text, "",
            table(rows, ["category", "policy", "plain tok/s (start)", "plain tok/s (end)", "end / start"]
                   + (["paired plain tok/s (range)"] if paired else [])), ""]


def equivalence(eq: pl.DataFrame | None, cfg: pl.DataFrame) -> list[str]:
    if eq is None or not len(eq):
        return []
    e = eq.join(cfg.select("config", "draft", "draft_label", "gamma", "gamma_label", "setup"), on="config")
    setups = (e["setup"] != "").any()  # a column only where some configuration has one (parallel N, KV types, ...)
    rows = [[r["category"]] + ([r["setup"]] if setups else []) + [
        r["draft_label"], r["gamma_label"], r["generations"], f(r["exact_match_pct"], ".0f") + "%",
        r["kernel_near_ties"], r["mismatches"], r["unchecked"]]
        for r in e.sort(["category", "setup", "draft", "gamma"]).iter_rows(named=True)]
    return ["## Output equivalence (greedy)", "",
            "Greedy speculative output against greedy plain decoding, token for token. At the first divergence the "
            "worker re-evaluated the target both ways, each path replayed as it ran: one token at a time (plain) "
            "and inside the verification block that held the position (speculative). A kernel near-tie: the two "
            "argmaxes differ there (llama.cpp's batched and single-token kernels round differently, and the top "
            "two logits were close). A mismatch: they agree, so the speculative output holds a token the target "
            "does not choose, a bug to investigate. Unchecked: no plain output was at hand when the "
            "configuration ran (a run without --paired whose baseline had not finished, or an older run).", "",
            table(rows, ["category"] + (["setup"] if setups else []) + [
                "draft", "gamma", "generations", "exact match", "kernel near-ties", "mismatches", "unchecked"]), ""] + (
        ["Where several requests decoded together (parallel N), the replay reproduces each step's sequences and "
         "block sizes but puts the replayed sequence first in the batch, not where its rows sat among the others: "
         "a mismatch there may still be the kernels' doing (compare its top-2 margin with the near-ties'), and "
         "no more than that is established.", ""] if e["setup"].str.contains("parallel").any() else [])
