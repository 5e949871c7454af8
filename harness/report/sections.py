"""Sections of the report and of its diagnostics: the timed verdicts and how a verdict is reached, per category,
quantization, memory, evidence until settled, plots."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from harness.analysis import verdict
from harness.report.fmt import ci, f, mib, pct_ci, table
from harness.report.replayed import settle
from harness.rundir import plan_rounds, trace_files


def break_even(r: dict) -> str:
    if r["adaptive"]:
        return "n/a (adaptive)"
    return "unreachable" if r["break_even_rate"] is None else f"{r['break_even_rate']:.0%}"


PLOTS = {"gamma.png": "Acceptance and tokens/s against gamma", "cost_model.png": "Predicted against measured speedup",
         "calibration.png": "Decode cost against tokens per call"}
REPORT_PLOTS = ("gamma.png",)  # the rest are the diagnostics' (report.diagnostics)


def plots(run_dir: Path, md_dir: Path, names: tuple[str, ...] = REPORT_PLOTS) -> list[str]:
    """Links to those of the plots `names` the run holds (write_reports draws them when matplotlib is there), so
    that --check neither draws nor depends on matplotlib."""
    out = run_dir / "plots"
    made = [name for name in names if (out / name).exists()]
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
    out = ["## Quantization per draft (timed rows)", ""] + (_targets(sweep, fidelity) if targets else []) + [
        "Per draft" + (" and target" if targets else "") + " over every gamma and category. Draft tok/s = proposed "
        "tokens per second of drafting; highest timed row = the highest speedup of any (category, gamma) row, one "
        "prompt's included: a row to look at, not a verdict (the report's answer gives those). A requantized draft "
        "can never be better than its source.", "",
        table(rows, (["target"] if targets else []) + ["draft", "policy", "bytes", "draft tok/s", "alpha",
                                                       "acceptance", "highest timed row"]), ""]
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


def memory(sweep: pl.DataFrame) -> tuple[list[str], list[str]]:
    """Memory on the first screen (what each configuration's worker held, on the host and on devices), and its
    detail below (what those figures are, the weights per model file by llama.cpp buffer)."""
    if "host_model_bytes" not in sweep.columns or sweep["host_model_bytes"].is_null().all():
        return _memory_before_breakdown(sweep), []
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
    first = [table(host, cols + ["weights", "KV", "compute", "peak RSS", "harness's own"]), ""]
    if dev:  # both labelled
        first = ["", "Host:", "", *first, "Devices:", "", table(dev, cols + ["device", "weights", "KV", "compute"]), ""]
    first = ["## Memory", *first]
    detail = ["## Memory in detail", "",
              "What llama.cpp allocated for each configuration, target and draft together (its own log of its "
              "buffers): weights, KV cache (at n_ctx, in the configuration's cache types) and compute buffers (the "
              "largest graph, which holds ubatch x vocabulary logits, and the logits output); the worker's peak "
              "RSS; and the harness's own share, the worker's RSS before any weights loaded (Python, numpy and the "
              "libraries, llama.cpp's code included). Peak RSS counts only pages touched: weights are mapped from "
              "the file and buffers are allocated for the largest batch, so it can lie below the sum of the "
              "buffers. The first screen gives them on the host" + (" and on devices." if dev else "."), "",
              "Weights per model file, by llama.cpp buffer (CPU_REPACK holds copies of weights rearranged for its "
              "CPU kernels, beside the file's mapping):", "",
              table(sorted([m, b] for m, b in buffers if b), ["model", "weights by buffer"]), ""]
    if not dev:
        detail += ["Devices: no device (every buffer is on the host: a CPU build, or no layer offloaded).", ""]
    return first, detail


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
                 "also": "further sweeps", "temp": "temperatures", "timed_scope": "timed subset's configurations",
                 "server_check": "llama-server check prompts", "prompt_chars": "prompt length (characters)"}


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
    cuts = ", ".join(_budget_cut(c, a, b) for c, (a, b) in zip(rec["cuts"], said))
    return (f"{head}; cut {cuts}: now about {now:.1f} min" if rec["fits"] else
            f"{head}; cut {cuts}: still about {now:.1f} min, and nothing more can be cut: running anyway") + ran


def _budget_cut(c: dict, was: str, now: str) -> str:
    """One cut of budget_line, with the budget that would keep what it cut where the cut says."""
    if c["param"] == "also":
        return f"the further sweeps ({'; '.join(x for x in c['before'] if x not in c['after'])}: {c['hint']})"
    if not c.get("hint"):
        return f"{BUDGET_LABELS[c['param']]} {was} -> {now}"
    kept = "the further sweeps kept: " if c["why"].startswith("the further sweeps kept") else ""  # an older run's
    return f"{BUDGET_LABELS[c['param']]} {was} -> {now} ({kept}{c['hint']})"


def timed_verdicts(v: pl.DataFrame | None) -> list[str]:
    """The verdicts of the timed configurations, a row per group: the first screen's table of a run without a
    replay, and a diagnostic of one with a replay (which it checks)."""
    if v is None or not len(v):
        return []
    vary = [k for k in ("target", "ngl", "threads", "setup") if v[k].n_unique() > 1]
    rows = []
    for r in v.iter_rows(named=True):
        star = "*" if r["adjusted"] else ""
        speed = ci(r["speedup"], r["lo"], r["hi"], unit="x") + star
        rows.append([r[k] for k in vary] + [r["category"], r["policy"], f(r["plain_tokens_per_s"], ".1f"),
                     f"{r['draft_label']} g={r['gamma_label']}" if r["draft"] else "", speed, r["verdict"],
                     r["prompts"] or "", settle(r), _why(r)])
    return ["## Verdict per category",
            table(rows, vary + ["category", "policy", "plain tok/s", "best (draft, gamma)", "speedup [95% CI]",
                                "verdict", "prompts", "settled by", "why"]), ""]


def verdict_rules(plan: dict) -> list[str]:
    """How a verdict is reached from a group's intervals (the timed table's, and the predicted one's)."""
    params = plan.get("params", {})
    gain = f"{params.get('min_gain', verdict.MIN_GAIN):.0%}"
    sequential = (" Rounds added until confident are judged look by look: each look spends a share of the 5% "
                  "(the shares add up to 5% whatever the number of looks), and a group keeps the first verdict "
                  "that settled it.") if params.get("until_confident") else ""
    return ["Speculate only when accepted progress per millisecond beats plain decoding by a gain worth having "
            f"({gain}), with 95% confidence: *speculate* when a configuration's interval lies above 1 + {gain} "
            "(widened, *, for having picked the best of the k configurations tried); *plain decoding* when every "
            "configuration's interval lies below 1; *no gain worth having* when every configuration's one-sided "
            f"95% upper bound lies below 1 + {gain}; *inconclusive* otherwise, with the further prompts that would "
            "settle the likeliest verdict with 80% probability at the measured spread. Configurations measured on "
            "one prompt take no part. Each row names the best configuration (or the one to use) and its speedup "
            "against " + ("plain decoding run beside it, prompt by prompt" if params.get("paired")
                          else "the category's plain baseline")
            + "; [a, b] is the 95% interval from a bootstrap over the category's prompts and their steps."
            + sequential + (_server_engine(plan) if params.get("engine") == "server" else ""), ""]


def _server_engine(plan: dict) -> str:
    """How a run with --engine server measured (bench.serverunit)."""
    binary = plan.get("params", {}).get("llama_server") or "make native's"
    return (f" Measured in llama-server ({binary}): every speculative request and its plain twin (--spec-type none) "
            "each on a server started for it, one server at a time, the twin first on every second prompt (ABBA), "
            "so drift favours neither; cache_prompt false, -np 1; speeds are the servers' own timings (predicted_n "
            "- 1 tokens over predicted_ms), acceptance their draft_n_accepted over draft_n. The servers report no "
            "steps: alpha, mean accepted length and per-step costs are not known, and a greedy output that differs "
            "from its plain twin's is counted unchecked.")


def _why(r: dict) -> str:
    if r["why"]:
        return r["why"]
    if r["adaptive"] and not r["proposed"]:
        return "adaptive gamma chose plain decoding at every step"
    if r["verdict"] == verdict.SPECULATE:
        return f"{r['k']} configurations compared" if r["k"] > 1 else ""
    why = verdict.where_time_goes(r["draft_ms"] or 0, r["verify_ms"] or 0, r["overhead_ms"] or 0)
    if r["verify_ms_per_call"] and r["ref_tokens_per_ms"]:
        why += f"; a verify call costs {r['verify_ms_per_call'] * r['ref_tokens_per_ms']:.1f}x a plain decode"
    return why
