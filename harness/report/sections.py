"""The report's detail sections, after the verdicts: per category, noise and drift, cost model, quantization,
memory, output equivalence, plots."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from harness.analysis.metrics import pace_spread
from harness.report.fmt import ci, f, mib, pct_ci, table
from harness.rundir import plan_rounds, trace_files


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


def break_even(r: dict) -> str:
    if r["adaptive"]:
        return "n/a (adaptive)"
    return "unreachable" if r["break_even_rate"] is None else f"{r['break_even_rate']:.0%}"


def _agreement(cm: pl.DataFrame, floor: pl.DataFrame | None) -> str:
    err = cm["error"].cast(pl.Float64).drop_nulls().abs()  # all null (no baseline finished): no dtype to abs
    if not len(err):
        return "No row has both a prediction and a measurement."
    return (f"Predicted within 10% of measured in {int((err <= 0.1).sum())} of {len(err)} rows "
            f"(mean absolute error {err.mean():.1%}).{timing_floor(floor)}")


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


PLOTS = {"gamma.png": "Acceptance and tokens/s against gamma", "cost_model.png": "Predicted against measured speedup",
         "calibration.png": "Decode cost against tokens per call"}


def plots(run_dir: Path, md_dir: Path) -> list[str]:
    """Links to the plots the run holds (write_reports draws them when matplotlib is there), so that --check
    neither draws nor depends on matplotlib."""
    out = run_dir / "plots"
    made = [name for name in PLOTS if (out / name).exists()]
    if not made and any(f.name.endswith(".gz") for f in trace_files(run_dir)):
        return ["Plots: `harness archive` kept only the first screen's; `harness report RUN_DIR` draws them again.",
                ""]
    if not made:
        return ["Plots: install the plotting extra (`pip install '.[plot]'`) and rerun `harness report`.", ""]
    rel = Path(os.path.relpath(out.resolve(), md_dir.resolve()))
    return ["## Plots", ""] + [f"![{PLOTS[n]}]({(rel / n).as_posix()})\n" for n in made]


def quantization(sweep: pl.DataFrame, fidelity: pl.DataFrame | None = None) -> list[str]:
    spec = sweep.filter(pl.col("draft") != "none")
    if not len(spec):
        return []
    targets = sweep["target"].n_unique() > 1
    q = spec.group_by(["target", "draft", "policy"], maintain_order=True).agg(
        pl.col("draft_bytes").first(), pl.col("proposed").sum(), pl.col("accepted").sum(),
        pl.col("draft_ms").sum(), pl.col("alpha").mean(), pl.col("speedup").max().alias("best_speedup"))
    rows = [([r["target"]] if targets else []) + [
             r["draft"], r["policy"], mib(r["draft_bytes"]) if r["draft_bytes"] else "0",
             f(r["proposed"] / r["draft_ms"] * 1000 if r["draft_ms"] else None, ".1f"), f(r["alpha"], ".3f"),
             f(r["accepted"] / r["proposed"] if r["proposed"] else None, ".1%"), f(r["best_speedup"]) + "x"]
            for r in q.iter_rows(named=True)]
    out = ["## Quantization", ""] + (_targets(sweep, fidelity) if targets else []) + [
        "Per draft" + (" and target" if targets else "") + " over every gamma and category. Draft tok/s = proposed "
        "tokens per second of drafting; best speedup = the best (category, gamma) row. A requantized draft can never "
        "be better than its source.", "",
        table(rows, (["target"] if targets else []) + ["draft", "policy", "bytes", "draft tok/s", "alpha",
                                                       "acceptance", "best speedup"]), ""]
    return out


def _targets(sweep: pl.DataFrame, fidelity: pl.DataFrame | None) -> list[str]:
    """One row per target: its size, plain speed and RAM, and how far it drifts from the first target."""
    plain = sweep.filter(pl.col("draft") == "none")
    t = plain.group_by(["target", "policy"], maintain_order=True).agg(
        pl.col("target_bytes").first(), pl.col("tokens_per_s").mean(), pl.col("peak_rss_bytes").max())
    fid = {} if fidelity is None or not len(fidelity) else {r["model"]: r for r in fidelity.iter_rows(named=True)}
    rows = [[r["target"], r["policy"], mib(r["target_bytes"]), f(r["tokens_per_s"], ".1f"), mib(r["peak_rss_bytes"]),
             f(fid.get(r["target"], {}).get("alpha_vs_reference"), ".4f"),
             f(fid.get(r["target"], {}).get("top1_agreement"), ".4f")] for r in t.iter_rows(named=True)]
    ref = next((r["model"] for r in fid.values() if r.get("alpha_vs_reference") == 1.0), None)
    note = (f"alpha and top-1 against {ref} (`harness fidelity`: teacher-forced on its greedy output, T=1)"
            if ref else "no fidelity figures (the run has none)")
    return ["Per target: file size, plain decoding speed (mean over categories), the plain worker's peak RSS; "
            f"{note}. A requantized target can never be better than its source.", "",
            table(rows, ["target", "policy", "bytes", "plain tok/s", "peak RSS", "alpha", "top-1"]), ""]


def memory(sweep: pl.DataFrame) -> list[str]:
    if "host_model_bytes" not in sweep.columns or sweep["host_model_bytes"].is_null().all():
        return _memory_before_breakdown(sweep)
    keys = ["target", "setup", "draft_label", "ngl", "ngl_draft"]
    m = sweep.group_by(keys, maintain_order=True).agg(
        pl.col("cache_k", "cache_v", "ubatch", "host_model_bytes", "host_kv_bytes", "host_compute_bytes", "devices",
               "device_model_bytes", "device_kv_bytes", "device_compute_bytes", "rss_before_models",
               "draft", "target_weights", "draft_weights").first(),
        pl.col("peak_rss_bytes").max()).sort(keys)
    targets = m["target"].n_unique() > 1
    host, dev, buffers = [], [], set()
    for r in m.iter_rows(named=True):
        who = ([r["target"]] if targets else []) + [f"{r['cache_k']}/{r['cache_v']}", r["ubatch"], r["draft_label"]]
        host.append(who + [mib(r["host_model_bytes"]), mib(r["host_kv_bytes"]), mib(r["host_compute_bytes"]),
                           mib(r["peak_rss_bytes"]), mib(r["rss_before_models"])])
        buffers |= {(r["target"], r["target_weights"]), (r["draft"], r["draft_weights"])}
        if r["devices"]:
            dev.append(who + [r["devices"], mib(r["device_model_bytes"]), mib(r["device_kv_bytes"]),
                              mib(r["device_compute_bytes"])])
    cols = (["target"] if targets else []) + ["target KV", "ubatch", "draft"]
    out = ["## Memory", "",
           "What llama.cpp allocated for each configuration, target and draft together (its own log of its "
           "buffers): weights, KV cache (at n_ctx, in the configuration's cache types) and compute buffers (the "
           "largest graph, which holds ubatch x vocabulary logits, and the logits output); the worker's peak RSS; "
           "and the harness's own share, the worker's RSS before any weights loaded (Python, numpy and the "
           "libraries, llama.cpp's code included). Peak RSS counts only pages touched: weights are mapped from the "
           "file and buffers are allocated for the largest batch, so it can lie below the sum of the buffers.", "",
           "Host:", "", table(host, cols + ["weights", "KV", "compute", "peak RSS", "harness's own"]), "",
           "Weights per model file, by llama.cpp buffer (CPU_REPACK holds copies of weights rearranged for its CPU "
           "kernels, beside the file's mapping):", "",
           table(sorted([m, b] for m, b in buffers if b), ["model", "weights by buffer"]), ""]
    if dev:
        return out + ["Devices:", "", table(dev, cols + ["device", "weights", "KV", "compute"]), ""]
    return out + ["Devices: no device (every buffer is on the host: a CPU build, or no layer offloaded).", ""]


def _memory_before_breakdown(sweep: pl.DataFrame) -> list[str]:
    """Runs from before llama.cpp's buffers were recorded: peak RSS, model files, KV at f16."""
    m = sweep.group_by("config", maintain_order=True).agg(
        pl.col("draft_label", "gamma_label", "policy", "peak_rss_bytes", "target_bytes", "draft_bytes", "kv_bytes")
        .first())
    rows = [[r["draft_label"], r["gamma_label"], r["policy"], mib(r["peak_rss_bytes"]),
             mib((r["target_bytes"] or 0) + (r["draft_bytes"] or 0)), mib(r["kv_bytes"])]
            for r in m.iter_rows(named=True)]
    return ["## Memory", "", "Peak RSS of each configuration's worker process; model files; KV cache at n_ctx (f16).",
            "", table(rows, ["draft", "gamma", "policy", "peak RSS", "model files", "KV cache"]), ""]


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


NOT_MEASURED = "–"


def latency(r: dict) -> str:
    """A row's mean latency; not measured where some generation restored its prompt (metrics.throughput)."""
    return NOT_MEASURED if r.get("prompt_restored") else f(r["latency_ms"], ".0f")


def per_category(sweep: pl.DataFrame) -> list[str]:
    """Three narrow tables per category: acceptance, speed, and where steps spend their time and stop."""
    lines = ["## Per category", "",
             "Every row states its draft, gamma and sampling policy; [a, b] is the row's 95% confidence interval "
             "(bootstrap over prompts and steps; one prompt: over steps only).", ""]
    for (cat,), g in sweep.group_by("category", maintain_order=True):
        g = g.sort([pl.col("policy") != "greedy", "policy", "draft", "gamma", "draft_label"])
        acc, speed, steps = [], [], []
        for r in g.iter_rows(named=True):
            key = [r["draft_label"], r["gamma_label"], r["policy"]]
            if r["draft"] == "none":
                speed.append(key + ["", f(r["tokens_per_s"], ".1f"), "", "", "", latency(r)])
                continue
            drafted = r["proposed"] / r["verify_steps"] if r["verify_steps"] else None
            acc.append(key + [r["proposed"], f(drafted), r["accepted"],
                              pct_ci(r["acceptance_rate"], r.get("acceptance_rate_lo"), r.get("acceptance_rate_hi")),
                              ci(r["mean_accepted_len"], r.get("mean_accepted_len_lo"), r.get("mean_accepted_len_hi")),
                              ci(r["alpha"], r.get("alpha_lo"), r.get("alpha_hi"), ".3f"), f(r["tokens_per_call"])])
            speed.append(key + [r.get("prompts") or "", f(r["tokens_per_s"], ".1f"), f(r["ref_tokens_per_s"], ".1f"),
                                ci(r["speedup"], r.get("speedup_lo"), r.get("speedup_hi"), unit="x"), break_even(r),
                                latency(r)])
            steps.append(key + [f(r["draft_ms_per_step"], ".1f"), f(r["verify_ms_per_call"], ".1f"),
                                f(r["overhead_ms_per_call"], ".2f"), r.get("pos_accept_prob") or "",
                                r.get("rejected_at_steps") or "", r.get("target_conf_accept_prob") or ""])
        lines += [f"### {cat}", ""]
        if acc:
            lines += [table(acc, ["draft", "gamma", "policy", "proposed", "drafted/step", "accepted", "acceptance",
                                  "accepted/step", "alpha", "tokens/call"]), ""]
        lines += [table(speed, ["draft", "gamma", "policy", "prompts", "tok/s", "plain tok/s", "speedup",
                                "break-even", "latency ms"]), ""]
        if any(r.get("prompt_restored") for r in g.iter_rows(named=True)):
            lines += [f"{NOT_MEASURED}: latency not measured, a prompt was restored from the run's prompt cache "
                      "(latency includes the prompt's evaluation; tok/s never does).", ""]
        if steps:
            lines += [table(steps, ["draft", "gamma", "policy", "draft ms/step", "verify ms/call",
                                    "overhead ms/call", "per-position", "rejections", "by target confidence"]), ""]
    return lines


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


def until_confident(plan: dict, verdicts: pl.DataFrame | None) -> list[str]:
    """What --until-confident added, why it stopped, and which verdicts it left open."""
    uc = plan.get("until_confident")
    if not uc:
        return []
    rounds = plan_rounds(plan)
    why = {"settled": "every verdict settled", "budget": f"the budget ({uc.get('budget_min')} min) was spent",
           "prompts": "no category with an open verdict had prompts left",
           "interrupted": "it was interrupted"}.get(uc.get("stopped"), uc.get("stopped") or "still running")
    lines = ["## Evidence until settled", "",
             f"`--until-confident` ran {len(rounds) - 1} round(s) after the first, each adding the next prompt of "
             f"every category whose verdict was still inconclusive; it stopped because {why}."]
    if uc.get("exhausted"):
        lines[-1] += f" Out of prompts: {', '.join(uc['exhausted'])}."
    open_ = [] if verdicts is None or not len(verdicts) else [
        f"{r['category']} ({r['policy']})" for r in verdicts.iter_rows(named=True) if r["verdict"] == "inconclusive"]
    if open_:
        lines[-1] += f" Left open: {', '.join(open_)}."
    hist = uc.get("history") or []
    if len(hist) > 1:
        after = {}
        for h in hist:
            for cat, pol, v in h["verdicts"]:
                after.setdefault((cat, pol), {})[h["round"]] = v
        rounds_ = [h["round"] for h in hist]
        rows = [[cat, pol] + [by.get(k, "") for k in rounds_] for (cat, pol), by in after.items()]
        lines += ["", "Verdicts after each round (prompts per category: 1 more per round where still open; the "
                  "workers' time spent so far in the header):", "",
                  table(rows, ["category", "policy"] + [f"round {h['round']} ({h['spent_s'] / 60:.0f} min)"
                                                        for h in hist])]
    return lines + [""]


BUDGET_LABELS = {"max_tokens": "max tokens", "replay_gamma": "replay gamma", "gamma": "gammas",
                 "timed_subset": "timed subset", "per_category": "prompts per category",
                 "also": "further sweeps"}


def budget_line(rec: dict | None, took: dict | None = None) -> str | None:
    """A run's budget in one line, from plan.json's `budget` (bench.budget): what was cut to fit and why, or that
    nothing more could be cut; and, once it ran, what it took (plan.json's `took_s`). None for a run without a
    budget."""
    if not rec or rec.get("budget_min") is None:
        return None
    planned = f" (fitted to {rec['planned']:.0%} of it)" if rec.get("planned") else ""
    head = f"budget {rec['budget_min']:g} min{planned}: estimated {rec['estimate_before_s'] / 60:.1f} min as asked"
    now = rec["estimate_after_s"] / 60
    ran = f"; took {took['total'] / 60:.1f} min before its report" if took and "total" in took else ""
    if not rec["cuts"]:
        return head + ("" if rec["fits"] else ", and nothing can be cut: running anyway") + ran
    said = [[",".join(map(str, v)) if isinstance(v, list) else str(v) for v in (c["before"], c["after"])]
            for c in rec["cuts"]]
    cuts = ", ".join(f"{BUDGET_LABELS[c['param']]} {a} -> {b}" if c["param"] != "also" else
                     f"the further sweeps ({'; '.join(c['before'])}: {c['hint']})"
                     for c, (a, b) in zip(rec["cuts"], said))
    return (f"{head}; cut {cuts}: now about {now:.1f} min" if rec["fits"] else
            f"{head}; cut {cuts}: still about {now:.1f} min, and nothing more can be cut: running anyway") + ran
