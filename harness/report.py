"""Reports from a run directory's traces: Markdown (tabulate), CSV, JSON, Parquet; and --check, which
recomputes every figure from the traces and compares it with the written report."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from tabulate import tabulate

from harness import metrics, verdict
from harness.errors import HarnessError
from harness.sampling import Policy
from harness.sweep import DRIFT_DIR, PAIRED_DIR, finished, read_plan, repair_results
from harness.trace import read_records

BASE_KEYS = ["target", "policy", "ngl", "threads", "category"]


def load_records(run_dir: Path, configs: set[str]) -> list[dict]:
    """Trace records of the given configurations (a worker killed midway leaves a partial trace: not counted)."""
    return [r for c in sorted(configs) if (run_dir / "traces" / f"{c}.jsonl").exists()
            for r in read_records(run_dir / "traces" / f"{c}.jsonl")]


def config_frame(plan: dict, results: dict[str, dict]) -> pl.DataFrame:
    from harness.sweep import Instance
    rows = []
    for d in plan["instances"]:
        inst = Instance(**d)
        res = results.get(inst.id, {})
        rows.append({"config": inst.id, "target": inst.target, "draft": inst.draft, "gamma": inst.gamma,
                     "adaptive": inst.adaptive, "gamma_label": inst.gamma_label,
                     "policy": Policy(**inst.policy).label, "ngl": inst.ngl, "ngl_draft": inst.ngl_draft,
                     "threads": inst.threads, "status": res.get("status", "not run"),
                     "error": res.get("error", ""), "peak_rss_bytes": res.get("peak_rss_bytes"),
                     "kv_bytes": res.get("kv_bytes"), "target_bytes": res.get("target_bytes"),
                     "draft_bytes": res.get("draft_bytes")})
    return pl.DataFrame(rows, infer_schema_length=None)


def _compact(df: pl.DataFrame, key_col: str, val_col: str, fmt: str) -> pl.DataFrame:
    return df.group_by(["config", "category"], maintain_order=True).agg(
        pl.format("{}:{}", pl.col(key_col).cast(pl.String), pl.col(val_col).map_elements(
            lambda v: format(v, fmt), return_dtype=pl.String)).str.join(" ").alias(f"{key_col}_{val_col}"))


def compute(run_dir: Path) -> dict[str, pl.DataFrame]:
    plan = read_plan(run_dir)
    results = finished(run_dir)
    cfg = config_frame(plan, results)
    ok = {c for c, r in results.items() if r.get("status") == "ok"}
    records = load_records(run_dir, ok)
    steps, gens = metrics.frames(records)
    out = {"configs": cfg}
    if not len(gens):
        return out
    keys = ["config", "category"]
    acc = metrics.acceptance(steps, keys)
    tp = metrics.throughput(gens, keys)
    sweep = tp.join(acc, on=keys, how="left").join(cfg.drop("error"), on="config", how="left")
    div = metrics.safe_div
    sweep = sweep.with_columns(
        div(pl.col("draft_ms"), pl.col("verify_steps")).alias("draft_ms_per_step"),
        div(pl.col("verify_ms"), pl.col("target_calls")).alias("verify_ms_per_call"),
        div(pl.col("overhead_ms"), pl.col("target_calls")).alias("overhead_ms_per_call"),
        div(pl.col("draft_ms") + pl.col("verify_ms") + pl.col("overhead_ms"), pl.col("target_calls")).alias("step_ms"),
    )
    base = sweep.filter(pl.col("draft") == "none").select(
        *BASE_KEYS, pl.col("tokens_per_ms").alias("base_tokens_per_ms"),
        pl.col("tokens_per_s").alias("base_tokens_per_s"))
    sweep = sweep.join(base, on=BASE_KEYS, how="left")
    paired = side_runs(run_dir / PAIRED_DIR, run_dir)  # recorded with the configuration it ran in
    if paired is not None:
        sweep = sweep.join(paired.select(*keys, pl.col("tokens_per_ms").alias("paired_tokens_per_ms"),
                                         pl.col("tokens_per_s").alias("paired_tokens_per_s")), on=keys, how="left")
    else:
        sweep = sweep.with_columns(pl.lit(None, pl.Float64).alias("paired_tokens_per_ms"),
                                   pl.lit(None, pl.Float64).alias("paired_tokens_per_s"))
    # the reference plain speed of each row: its paired plain runs where the run has them, else the category's
    # plain baseline configuration
    sweep = sweep.with_columns(
        pl.coalesce("paired_tokens_per_ms", "base_tokens_per_ms").alias("ref_tokens_per_ms"),
        pl.coalesce("paired_tokens_per_s", "base_tokens_per_s").alias("ref_tokens_per_s"),
        (pl.col("tokens_per_ms") / pl.col("base_tokens_per_ms")).alias("speedup_vs_baseline"),
    ).with_columns((pl.col("tokens_per_ms") / pl.col("ref_tokens_per_ms")).alias("speedup"))
    end = closing_baselines(run_dir, cfg)
    if end is not None:
        sweep = sweep.join(end, on=BASE_KEYS, how="left").with_columns(
            (pl.col("base_end_tokens_per_s") / pl.col("base_tokens_per_s")).alias("drift"))
    spec = steps.filter(pl.col("proposed") > 0)
    if len(spec):
        for extra in (_compact(metrics.per_position(spec, keys), "pos", "accept_prob", ".2f"),
                      _compact(metrics.rejection_histogram(spec, keys), "rejected_at", "steps", "d"),
                      _compact(metrics.by_confidence(spec, keys), "target_conf", "accept_prob", ".2f")):
            sweep = sweep.join(extra, on=keys, how="left")
    be = [None if r["adaptive"] else verdict.break_even_rate(
        r["step_ms"] or 0, 1 / r["ref_tokens_per_ms"] if r["ref_tokens_per_ms"] else 0, r["gamma"])
        for r in sweep.iter_rows(named=True)]
    sweep = sweep.with_columns(pl.Series("break_even_rate", be, dtype=pl.Float64))
    out["sweep"] = sweep
    out["equivalence"] = equivalence(gens, metrics.frame(records, "divergence"), cfg)
    return out


def side_runs(d: Path, results: Path | None = None) -> pl.DataFrame | None:
    """Throughput per configuration and category of the generations in a side directory (drift/, paired/) of
    the configurations that finished (results.jsonl of d, or another run directory's); None without any."""
    res = results or d
    ok = {c for c, r in finished(res).items() if r.get("status") == "ok"} if d.is_dir() else set()
    _, gens = metrics.frames(load_records(d, ok))
    return metrics.throughput(gens, ["config", "category"]) if len(gens) else None


def closing_baselines(run_dir: Path, cfg: pl.DataFrame) -> pl.DataFrame | None:
    """Plain tokens/s per baseline key from the baselines bench ran again after the sweep; None without them."""
    tp = side_runs(run_dir / DRIFT_DIR)
    if tp is None:
        return None
    tp = tp.join(cfg.select("config", *BASE_KEYS[:-1]), on="config")
    return tp.select(*BASE_KEYS, pl.col("tokens_per_s").alias("base_end_tokens_per_s"))


def equivalence(gens: pl.DataFrame, divergences: pl.DataFrame, cfg: pl.DataFrame) -> pl.DataFrame:
    """Greedy speculative outputs against the greedy baseline of the same target, offload and prompt; each
    divergence classified by the kernel check its worker recorded (harness.divergence)."""
    g = gens.join(cfg.select("config", "target", "draft", "gamma", "policy", "ngl", "threads"), on="config")
    g = g.filter(pl.col("policy") == "greedy")
    base = g.filter(pl.col("draft") == "none")
    if not len(base):
        return pl.DataFrame()
    bkey = ["target", "ngl", "threads", "prompt_id", "repeat"]
    btok = {tuple(r[k] for k in bkey): r["tokens"] for r in base.iter_rows(named=True)}
    found = {(r["config"], r["prompt_id"], r["repeat"]): r for r in divergences.iter_rows(named=True)}
    rows = []
    for r in g.filter(pl.col("draft") != "none").iter_rows(named=True):
        b = btok.get(tuple(r[k] for k in bkey))
        if b is None:
            continue
        c = metrics.classify(r["tokens"], b, found.get((r["config"], r["prompt_id"], r["repeat"])))
        rows.append({"config": r["config"], "category": r["category"], "prompt_id": r["prompt_id"], **c})
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, infer_schema_length=None).group_by(["config", "category"], maintain_order=True).agg(
        pl.len().alias("generations"), (pl.col("equal").mean() * 100).alias("exact_match_pct"),
        (pl.col("kind") == "kernel near-tie").sum().alias("kernel_near_ties"),
        (pl.col("kind") == "mismatch").sum().alias("mismatches"),
        (pl.col("kind") == "unchecked").sum().alias("unchecked"))


# -- rendering -----------------------------------------------------------------------------------------------

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


def models_info(names: set[str]) -> dict[str, dict]:
    """What the report header says of each model, recorded in plan.json when the run starts, so a report
    never depends on the model files still being there."""
    from harness.models.catalog import resolve
    from harness.models.store import read_sidecar
    from harness.pair import parse_ngram
    out = {}
    for n in sorted(names - {"none"}):
        if parse_ngram(n) is not None:
            out[n] = {"quant": "", "bytes": 0, "sha256": "", "note": "n-gram lookup (no model)"}
            continue
        m = resolve(n)
        side = read_sidecar(m.path)
        note = f"requantized from {side.get('derived_from', m.derive_from)} (never better than its source)" \
            if m.requantized else ""
        out[n] = {"quant": m.quant or side.get("info", {}).get("quant", ""), "bytes": m.path.stat().st_size,
                  "sha256": side.get("sha256") or m.sha256 or "", "note": note}
    return out


def render_markdown(run_dir: Path, data: dict[str, pl.DataFrame]) -> str:
    plan = read_plan(run_dir)
    lines = _header(plan, run_dir)
    cfg = data["configs"]
    sweep = data.get("sweep")
    failed = cfg.filter(pl.col("status") != "ok")
    if sweep is None or not len(sweep):
        lines += ["No configuration finished.", ""]
    else:
        cost_lines, points = _cost_model(sweep, run_dir)
        lines += _verdicts(sweep) + _drift(sweep) + _per_category(sweep) + cost_lines + _quantization(sweep) + \
            _memory(sweep) + _equivalence(data.get("equivalence"), cfg) + _plots(sweep, points, run_dir)
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


def _costs_for(r: dict, run_dir: Path):
    from dataclasses import replace

    from harness.calibrate import costs_at
    from harness.engine import EngineConfig
    from harness.pair import parse_ngram
    draft = None if parse_ngram(r["draft"]) is not None else r["draft"]
    # the calibration is interpolated to the mean tokens in the cache during generation: costs grow with it
    costs = costs_at(run_dir / "calibration", r["target"], draft, EngineConfig(threads=r["threads"]).resolved_threads(),
                     r["ngl"], r["ngl_draft"], r["context"], r["overhead_ms_per_call"] or 0.0)
    if costs is None or not r["ref_tokens_per_ms"]:
        return costs
    # the calibration gives the curve's shape; its level comes from the row's plain reference, measured on
    # the real prompts (filler text at an interpolated context misjudges long prompts)
    level = 1 / r["ref_tokens_per_ms"] / costs.target_ms[0]
    return replace(costs, target_ms=[x * level for x in costs.target_ms])


def _cost_model(sweep: pl.DataFrame, run_dir: Path) -> tuple[list[str], list]:
    """Predicted speedup from calibrated costs and measured alpha, against the measured speedup."""
    from harness.costmodel import best_gamma, predicted_speedup
    rows, best, points = [], {}, []
    spec = sweep.filter((pl.col("draft") != "none") & pl.col("alpha").is_not_null())
    for r in spec.sort(["category", "policy", "draft", "gamma"]).iter_rows(named=True):
        costs = _costs_for(r, run_dir)
        if costs is None or r["gamma"] + 1 > len(costs.target_ms):
            continue
        if r["adaptive"]:
            rows.append([r["category"], r["policy"], r["draft"], f"auto<={r['gamma']}", _f(r["alpha"], ".3f"), "",
                         _f(r["speedup"]) + "x", "", ""])
            continue
        pred = predicted_speedup(r["alpha"], r["gamma"], costs)
        err = (pred / r["speedup"] - 1) if r["speedup"] else None
        if r["speedup"]:
            points.append((pred, r["speedup"], r["category"]))
        rse = r["tokens_per_call_rse"]
        rows.append([r["category"], r["policy"], r["draft"], r["gamma"], _f(r["alpha"], ".3f"), _f(pred) + "x",
                     _f(r["speedup"]) + "x", _f(err, "+.0%"), "" if rse is None else f"±{rse:.0%}"])
        key = (r["category"], r["policy"], r["draft"])
        best.setdefault(key, (r["alpha"], costs, []))[2].append(r["gamma"])
    if not rows:
        return [], points
    auto_rows = []  # an adaptive run that chose plain decoding throughout has no alpha: it still counts here
    for (cat, pol, draft), g in sweep.filter(pl.col("draft") != "none").group_by(["category", "policy", "draft"],
                                                                                maintain_order=True):
        auto, fixed = g.filter(pl.col("adaptive")), g.filter(~pl.col("adaptive"))
        if not len(auto) or not len(fixed):
            continue
        bar = max(fixed["speedup"].max() or 0.0, 1.0)
        got = auto["speedup"][0]
        auto_rows.append([cat, pol, draft, _f(got) + "x", _f(fixed["speedup"].max()) + "x", _f(got / bar, ".2f"),
                          "yes" if got >= 0.95 * bar else "NO"])
    rec = [[c, p, d, best_gamma(a, costs, max(len(costs.target_ms) - 1, 1)) or "0 (plain)"]
           for (c, p, d), (a, costs, _) in best.items()]
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
                               "within 5%"]), ""] if auto_rows else []), points


PLOTS = {"gamma.png": "Acceptance and tokens/s against gamma", "cost_model.png": "Predicted against measured speedup",
         "calibration.png": "Decode cost against tokens per call"}


def _plots(sweep: pl.DataFrame, points: list, run_dir: Path) -> list[str]:
    """Drawn when matplotlib is there; linked whenever the run holds them, so --check does not depend on it."""
    from harness import plots
    out = run_dir / "plots"
    if plots.available():
        out.mkdir(exist_ok=True)
        plots.gamma_curves(sweep, out)
        plots.predicted_vs_measured(points, out)
        plots.calibration(run_dir, out)
    made = [name for name in PLOTS if (out / name).exists()]
    if not made:
        return ["Plots: install the plotting extra (`pip install '.[plot]'`) and rerun `harness report`.", ""]
    rel = Path("runs") / run_dir.name / "plots"
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


# -- files ---------------------------------------------------------------------------------------------------

def reports_root(run_dir: Path) -> Path:
    return run_dir.parent.parent  # reports/runs/<run> -> reports/


def write_reports(run_dir: Path, formats: tuple[str, ...] = ("md", "json")) -> Path:
    repair_results(run_dir)
    data = compute(run_dir)
    md_text = render_markdown(run_dir, data)
    root = reports_root(run_dir)
    md = root / f"{run_dir.name}.md"
    for fmt in formats:
        if fmt == "md":
            md.write_text(md_text)
            (root / "latest.md").write_text(md_text)
        else:
            export(data, run_dir, fmt)
    return md


def export(data: dict[str, pl.DataFrame], run_dir: Path, fmt: str) -> Path:
    sweep = data.get("sweep", pl.DataFrame())
    flat = sweep.select([c for c in sweep.columns if sweep[c].dtype != pl.List(pl.Int64)]) if len(sweep) else sweep
    path = run_dir / f"metrics.{fmt}"
    if fmt == "csv":
        flat.write_csv(path)
    elif fmt == "json":
        path.write_text(json.dumps(flat.to_dicts(), indent=1, default=str))
    elif fmt == "parquet":
        flat.write_parquet(path)
    else:
        raise HarnessError(f"unknown report format '{fmt}' (md, csv, json, parquet)")
    return path


def check(run_dir: Path) -> list[str]:
    """Differences between the written Markdown report and one recomputed from the traces now."""
    read_plan(run_dir)  # a directory that is not a run says so first
    md = reports_root(run_dir) / f"{run_dir.name}.md"
    if not md.exists():
        raise HarnessError(f"no report for {run_dir} at {md}: run `harness report {run_dir}` first")
    fresh = render_markdown(run_dir, compute(run_dir)).splitlines()
    old = md.read_text().splitlines()
    diffs = [f"line {i + 1}: report has {a!r}, traces give {b!r}" for i, (a, b) in enumerate(zip(old, fresh)) if a != b]
    if len(old) != len(fresh):
        diffs.append(f"report has {len(old)} lines, traces give {len(fresh)}")
    return diffs
