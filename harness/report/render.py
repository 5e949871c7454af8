"""The Markdown report: sections rendered from the frames of report.tables."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl
from tabulate import tabulate

from harness.analysis import verdict
from harness.rundir import read_plan


def _f(v, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


def _mib(v) -> str:
    return "" if v is None else f"{v / 2**20:.0f} MiB"


def _table(rows: list[list], headers: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _header(plan: dict, run_dir: Path) -> list[str]:
    s = plan.get("system", {})
    lines = ["# Speculative decoding benchmark", "",
             f"- date: {s.get('date', '')}; host: {s.get('host', '')} ({s.get('os', '')})",
             f"- CPU: {s.get('cpu', '')}, {s.get('cores_physical')} physical / {s.get('cores_logical')} logical cores;"
             f" RAM {(s.get('ram_bytes') or 0) / 2**30:.1f} GiB",
             f"- backend: {s.get('backend', '')}",
             f"- llama.cpp system info: `{s.get('llama_system_info', '')}`"]
    if s.get("amx_extra_buffers_disabled"):
        lines.append("- note: this llama.cpp build has AMX kernels, which crash on batched decodes "
                     "(ggml-org/llama.cpp#20824); extra buffer types (AMX, weight repacking) were switched off")
    pk = s.get("packages", {})
    lines.append("- packages: " + ", ".join(f"{k} {v}" for k, v in pk.items()))
    lines += [f"- command: `{plan.get('command', '')}`", f"- raw traces: `{run_dir / 'traces'}` (one JSONL per "
              "configuration; every figure below is computed from them: `harness report RUN_DIR --check`)", ""]
    rows = [[n, m["quant"], _mib(m["bytes"]) if m["bytes"] else "", m["sha256"][:12], m["note"]]
            for n, m in sorted(plan.get("models", {}).items())]
    lines += ["## Models", "", _table(rows, ["model", "quant", "size", "sha256", "note"]), ""]
    return lines


def render_markdown(run_dir: Path, data: dict[str, pl.DataFrame], md_dir: Path) -> str:
    """The report of run_dir, to be written in md_dir (paths in it are relative to that directory)."""
    plan = read_plan(run_dir)
    lines = _header(plan, Path(os.path.relpath(run_dir.resolve(), md_dir.resolve())))
    cfg = data["configs"]
    sweep = data.get("sweep")
    failed = cfg.filter(pl.col("status") != "ok")
    if sweep is None or not len(sweep):
        lines += ["No configuration finished.", ""]
    else:
        lines += _verdicts(sweep) + _drift(sweep) + _per_category(sweep) + _cost_model(data) + _quantization(sweep) + \
            _memory(sweep) + _equivalence(data.get("equivalence"), cfg) + _plots(run_dir, md_dir)
    if len(failed):
        lines += ["## Configurations that did not finish", "",
                  _table([[r["config"], r["draft"], r["gamma_label"], r["policy"], r["status"], r["error"]]
                          for r in failed.iter_rows(named=True)],
                         ["config", "draft", "gamma", "policy", "status", "error"]), ""]
    lines += ["## How to read this", "",
              "- acceptance = accepted / proposed draft tokens; accepted/step = mean accepted draft tokens per "
              "verification step; alpha = mean of sum_x min(p, q) under the row's sampling policy over the "
              "positions verification reached (accepted drafts and each step's first rejection; under greedy, "
              "the rate at which draft and target argmax agree there). Three different figures: never compare "
              "one with another.",
              "- tokens/call = emitted tokens per target decode (accepted + the correction or bonus token).",
              "- speedup = tokens/s against plain decoding of the same target, policy, offload, threads and "
              "category, measured in the same run: in a paired run (`--paired`), against the plain generations "
              "run prompt by prompt beside this configuration's in its worker (plain tok/s, per row); otherwise "
              "against the category's plain baseline configuration. Speculate only where accepted progress per "
              "millisecond (tokens/ms) beats plain decoding, i.e. speedup > 1.",
              "- break-even = the acceptance rate at which this configuration's measured step cost "
              "(draft + verify + overhead) would match plain decoding: (step_ms / base_ms_per_token - 1) / gamma; "
              "'unreachable' when even 100% acceptance loses.",
              "- per-position: P(position i accepted | reached); rejections: where steps stopped (none = all "
              "accepted); by target confidence: acceptance of tested positions by the target's top probability.",
              ""]
    return "\n".join(lines)


def _verdicts(sweep: pl.DataFrame) -> list[str]:
    rows = []
    for (cat, pol), g in sweep.group_by(["category", "policy"], maintain_order=True):
        spec = g.filter(pl.col("draft") != "none").sort("speedup", descending=True, nulls_last=True)
        base = g.filter(pl.col("draft") == "none")
        if not len(base) or not len(spec):
            continue
        b, s = base.row(0, named=True), spec.row(0, named=True)
        decision = verdict.decide(s["speedup"])
        # a paired speedup has no drift in it; one against the opening baseline is only as good as the drift
        if s["paired_tokens_per_ms"] is None and b.get("drift") and abs(s["speedup"] - 1) <= abs(b["drift"] - 1):
            decision += " (within drift)"
        why = ""
        if s["adaptive"] and not s["proposed"]:
            decision = "plain decoding"
            why = "adaptive gamma chose plain decoding at every step"
        elif decision != "speculate":
            why = verdict.where_time_goes(s["draft_ms"], s["verify_ms"], s["overhead_ms"])
            if s["verify_ms_per_call"] and s["ref_tokens_per_ms"]:
                why += f"; a verify call costs {s['verify_ms_per_call'] * s['ref_tokens_per_ms']:.1f}x a plain decode"
        rows.append([cat, pol, _f(s["ref_tokens_per_s"], ".1f"), f"{s['draft']} g={s['gamma_label']}",
                     _f(s["tokens_per_s"], ".1f"), _f(s["speedup"]) + "x", _f(s["acceptance_rate"], ".0%"),
                     _break_even(s), decision, why])
    return ["## Verdict per category", "",
            "Best speculative configuration per category and policy against plain decoding.", "",
            _table(rows, ["category", "policy", "plain tok/s", "best (draft, gamma)", "tok/s", "speedup",
                          "acceptance", "break-even acceptance", "verdict", "where the time goes"]), ""]


def _drift(sweep: pl.DataFrame) -> list[str]:
    if "drift" not in sweep.columns:
        return []
    base = sweep.filter((pl.col("draft") == "none") & pl.col("drift").is_not_null())
    if not len(base):
        return []
    rng = sweep.filter(pl.col("paired_tokens_per_s").is_not_null()).group_by(["category", "policy"]).agg(
        pl.col("paired_tokens_per_s").min().alias("lo"), pl.col("paired_tokens_per_s").max().alias("hi"))
    base = base.join(rng, on=["category", "policy"], how="left")
    paired = base["lo"].is_not_null().any()
    rows = [[r["category"], r["policy"], _f(r["base_tokens_per_s"], ".2f"), _f(r["base_end_tokens_per_s"], ".2f"),
             _f(r["drift"], ".3f")] + ([f"{_f(r['lo'], '.2f')}-{_f(r['hi'], '.2f')}"] if paired else [])
            for r in base.iter_rows(named=True)]
    worst = max(abs(d - 1) for d in base["drift"])
    text = ("The plain baselines ran again after every other configuration; the two differ by up to "
            f"{worst:.1%} here. ")
    if paired:
        text += ("Speedups are against the plain runs paired with each configuration in its worker, so this "
                 "drift is not in them; the last column is the range of those paired plain speeds over the run.")
    else:
        text += ("Speedups are against the first run, so a speedup closer to 1.00x than its category's drift is "
                 "within this run's noise (the verdict says so).")
    return ["## Drift", "", text, "",
            _table(rows, ["category", "policy", "plain tok/s (start)", "plain tok/s (end)", "end / start"]
                   + (["paired plain tok/s (range)"] if paired else [])), ""]


def _break_even(r: dict) -> str:
    if r["adaptive"]:
        return "n/a (adaptive)"
    return "unreachable" if r["break_even_rate"] is None else f"{r['break_even_rate']:.0%}"


def _per_category(sweep: pl.DataFrame) -> list[str]:
    lines = ["## Per category", ""]
    cols = ["draft", "gamma", "policy", "ngl", "proposed", "accepted", "acceptance", "accepted/step", "tokens/call",
            "alpha", "draft ms/step", "verify ms/call", "overhead ms/call", "tok/s", "plain tok/s", "speedup",
            "latency ms",
            "break-even", "per-position", "rejections", "by target confidence"]
    for cat, g in sweep.group_by("category", maintain_order=True):
        rows = []
        for r in g.sort(["policy", "draft", "gamma"]).iter_rows(named=True):
            spec = r["draft"] != "none"
            rows.append([r["draft"], r["gamma_label"], r["policy"], r["ngl"], r["proposed"] if spec else "",
                         r["accepted"] if spec else "", _f(r["acceptance_rate"], ".1%"), _f(r["mean_accepted_len"]),
                         _f(r["tokens_per_call"]), _f(r["alpha"], ".3f"), _f(r["draft_ms_per_step"], ".1f"),
                         _f(r["verify_ms_per_call"], ".1f"), _f(r["overhead_ms_per_call"], ".2f"),
                         _f(r["tokens_per_s"], ".1f"), _f(r["ref_tokens_per_s"], ".1f") if spec else "",
                         _f(r["speedup"]) + "x", _f(r["latency_ms"], ".0f"),
                         _break_even(r) if spec else "",
                         r.get("pos_accept_prob") or "", r.get("rejected_at_steps") or "",
                         r.get("target_conf_accept_prob") or ""])
        lines += [f"### {cat[0]}", "", _table(rows, cols), ""]
    return lines


def _cost_model(data: dict[str, pl.DataFrame]) -> list[str]:
    cm = data.get("cost_model")
    if cm is None or not len(cm):
        return []
    rows = [[r["category"], r["policy"], r["draft"], r["gamma_label"], _f(r["alpha"], ".3f"),
             _f(r["predicted"]) + ("x" if r["predicted"] is not None else ""), _f(r["speedup"]) + "x",
             _f(r["error"], "+.0%"), "" if r["tokens_per_call_rse"] is None else f"±{r['tokens_per_call_rse']:.0%}"]
            for r in cm.iter_rows(named=True)]
    rec = [[r["category"], r["policy"], r["draft"], r["gamma"] or "0 (plain)"]
           for r in data["recommended"].iter_rows(named=True)]
    auto = data.get("adaptive")
    auto_rows = [[r["category"], r["policy"], r["draft"], _f(r["auto"]) + "x", _f(r["best_fixed"]) + "x",
                  _f(r["ratio"], ".2f"), "yes" if r["within_5pct"] else "NO"]
                 for r in (auto.iter_rows(named=True) if auto is not None else [])]
    return ["## Cost model", "",
            "Predicted speedup = E * T_target(1) / (gamma * T_draft(1) + T_verify(gamma+1) + overhead), "
            "E = (1 - alpha^(gamma+1)) / (1 - alpha) (Leviathan et al. 2023), with the decode costs calibrated "
            "in this run (`calibration/`, interpolated to the row's mean context length, scaled so that T_target(1) "
            "is the same category's measured plain decode), this row's measured alpha and per-step overhead. "
            "s.e. is the relative standard error of the row's measured tokens per target call, from its "
            "step-to-step spread: how far the acceptance draws of a short run move the measured speedup on their "
            "own (the prediction uses alpha, which under sampling is an expectation and steadier; under greedy the "
            "same draws set both); an error within about two of them is sampling noise.",
            "", _table(rows, ["category", "policy", "draft", "gamma", "alpha", "predicted", "measured", "error",
                              "s.e."]), "",
            "Recommended gamma (the cost model's best at the measured alpha; 0 = plain decoding):", "",
            _table(rec, ["category", "policy", "draft", "gamma"]), ""] + ([
            "Adaptive gamma against the better of the best fixed gamma and plain decoding (speedup 1.00x), same "
            "run; the goal is to be within 5% of it:", "",
            _table(auto_rows, ["category", "policy", "draft", "auto", "best fixed", "auto / max(best fixed, plain)",
                               "within 5%"]), ""] if auto_rows else [])


PLOTS = {"gamma.png": "Acceptance and tokens/s against gamma", "cost_model.png": "Predicted against measured speedup",
         "calibration.png": "Decode cost against tokens per call"}


def _plots(run_dir: Path, md_dir: Path) -> list[str]:
    """Links to the plots the run holds (write_reports draws them when matplotlib is there), so that --check
    neither draws nor depends on matplotlib."""
    out = run_dir / "plots"
    made = [name for name in PLOTS if (out / name).exists()]
    if not made:
        return ["Plots: install the plotting extra (`pip install '.[plot]'`) and rerun `harness report`.", ""]
    rel = Path(os.path.relpath(out.resolve(), md_dir.resolve()))
    return ["## Plots", ""] + [f"![{PLOTS[n]}]({(rel / n).as_posix()})\n" for n in made]


def _quantization(sweep: pl.DataFrame) -> list[str]:
    spec = sweep.filter(pl.col("draft") != "none")
    if not len(spec):
        return []
    q = spec.group_by(["draft", "policy"], maintain_order=True).agg(
        pl.col("draft_bytes").first(), pl.col("proposed").sum(), pl.col("accepted").sum(),
        pl.col("draft_ms").sum(), pl.col("alpha").mean(), pl.col("speedup").max().alias("best_speedup"))
    rows = [[r["draft"], r["policy"], _mib(r["draft_bytes"]) if r["draft_bytes"] else "0",
             _f(r["proposed"] / r["draft_ms"] * 1000 if r["draft_ms"] else None, ".1f"), _f(r["alpha"], ".3f"),
             _f(r["accepted"] / r["proposed"] if r["proposed"] else None, ".1%"), _f(r["best_speedup"]) + "x"]
            for r in q.iter_rows(named=True)]
    return ["## Draft quantization", "",
            "Per draft over every gamma and category. Draft tok/s = proposed tokens per second of drafting. "
            "A requantized draft can never be better than its source.", "",
            _table(rows, ["draft", "policy", "bytes", "draft tok/s", "alpha", "acceptance", "best speedup"]), ""]


def _memory(sweep: pl.DataFrame) -> list[str]:
    m = sweep.group_by("config", maintain_order=True).agg(
        pl.col("draft", "gamma_label", "policy", "peak_rss_bytes", "target_bytes", "draft_bytes", "kv_bytes").first())
    rows = [[r["draft"], r["gamma_label"], r["policy"], _mib(r["peak_rss_bytes"]),
             _mib((r["target_bytes"] or 0) + (r["draft_bytes"] or 0)), _mib(r["kv_bytes"])]
            for r in m.iter_rows(named=True)]
    return ["## Memory", "", "Peak RSS of each configuration's worker process; model files; KV cache at n_ctx (f16).",
            "", _table(rows, ["draft", "gamma", "policy", "peak RSS", "model files", "KV cache"]), ""]


def _equivalence(eq: pl.DataFrame | None, cfg: pl.DataFrame) -> list[str]:
    if eq is None or not len(eq):
        return []
    e = eq.join(cfg.select("config", "draft", "gamma", "gamma_label"), on="config")
    rows = [[r["category"], r["draft"], r["gamma_label"], r["generations"], _f(r["exact_match_pct"], ".0f") + "%",
             r["kernel_near_ties"], r["mismatches"], r["unchecked"]]
            for r in e.sort(["category", "draft", "gamma"]).iter_rows(named=True)]
    return ["## Output equivalence (greedy)", "",
            "Greedy speculative output against greedy plain decoding, token for token. At the first divergence the "
            "worker re-evaluated the target both ways, each path replayed as it ran: one token at a time (plain) "
            "and inside the verification block that held the position (speculative). A kernel near-tie: the two "
            "argmaxes differ there (llama.cpp's batched and single-token kernels round differently, and the top "
            "two logits were close). A mismatch: they agree, so the speculative output holds a token the target "
            "does not choose, a bug to investigate. Unchecked: no plain output was at hand when the "
            "configuration ran (a run without --paired whose baseline had not finished, or an older run).", "",
            _table(rows, ["category", "draft", "gamma", "generations", "exact match", "kernel near-ties",
                          "mismatches", "unchecked"]), ""]
