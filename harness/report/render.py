"""The Markdown report. The first screen answers the question (the verdict per category with its interval, and
one plot); the detail follows (report.sections)."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from harness.analysis import verdict
from harness.report import answer, concurrency, replayed, sections
from harness.report.fmt import ci, f, mib, table
from harness.rundir import read_plan

VERDICT_PLOT = "verdicts.png"


def render_markdown(run_dir: Path, data: dict[str, pl.DataFrame], md_dir: Path) -> str:
    """The report of run_dir, to be written in md_dir (paths in it are relative to that directory)."""
    plan = read_plan(run_dir)
    rel = Path(os.path.relpath(run_dir.resolve(), md_dir.resolve()))
    sweep = data.get("sweep")
    lines = ["# Should I use speculative decoding here?", "", _summary(plan), ""]
    if sweep is None or not len(sweep):
        lines += ["No configuration finished.", ""]
    else:
        # the answer in words, then its table and plot: with a replay, the verdicts predicted from every prompt
        # (the timed ones check them), else the timed ones
        timed = _verdicts(data.get("verdicts"), plan)
        predicted = replayed.verdict_section(data, plan)
        lines += answer.section(data, plan) + (predicted or timed) + _verdict_plot(run_dir, rel) + \
            (timed if predicted else []) + replayed.sections(data, plan) + \
            sections.until_confident(plan, data.get("verdicts")) + concurrency.section(data, run_dir, rel)
    lines += _machine(plan, rel)
    if sweep is not None and len(sweep):
        lines += sections.noise(data, plan) + sections.drift(sweep) + sections.per_category(sweep) + \
            sections.cost_model(data) + sections.quantization(sweep, data.get("fidelity")) + sections.memory(sweep) + \
            sections.equivalence(data.get("equivalence"), data["configs"]) + sections.plots(run_dir, md_dir)
    lines += _failures(data) + _how_to_read()
    return "\n".join(lines)


def _summary(plan: dict) -> str:
    s, p = plan.get("system", {}), plan.get("params", {})
    sweeps = [p, *p.get("also", [])]  # a further sweep's lists replace the main one's, the rest inherited
    targets = ", ".join(dict.fromkeys(t for q in sweeps for t in q.get("target", p.get("target", []))))
    drafts = ", ".join(dict.fromkeys(d for q in sweeps for d in q.get("draft", p.get("draft", [])) if d != "none"))
    return (f"Target{'s' * (', ' in targets)} {targets}; drafts {drafts or 'none'}; "
            f"gamma {', '.join(map(str, p.get('gamma', [])))}; "
            f"{s.get('cpu', 'unknown CPU')}, {s.get('cores_physical')} cores, {s.get('backend', '')}; "
            f"{s.get('date', '')}.")


def _verdicts(v: pl.DataFrame | None, plan: dict) -> list[str]:
    if v is None or not len(v):
        return []
    vary = [k for k in ("target", "ngl", "threads", "setup") if v[k].n_unique() > 1]
    rows = []
    for r in v.iter_rows(named=True):
        star = "*" if r["adjusted"] else ""
        speed = ci(r["speedup"], r["lo"], r["hi"], unit="x") + star
        rows.append([r[k] for k in vary] + [r["category"], r["policy"], f(r["plain_tokens_per_s"], ".1f"),
                     f"{r['draft_label']} g={r['gamma_label']}" if r["draft"] else "", speed, r["verdict"],
                     r["prompts"] or "", replayed.settle(r), _why(r)])
    params = plan.get("params", {})
    gain = f"{params.get('min_gain', verdict.MIN_GAIN):.0%}"
    sequential = (" Rounds added until confident are judged look by look: each look spends a share of the 5% "
                  "(the shares add up to 5% whatever the number of looks), and a group keeps the first verdict "
                  "that settled it.") if params.get("until_confident") else ""
    return ["## Verdict per category", "",
            "Speculate only when accepted progress per millisecond beats plain decoding by a gain worth having "
            f"({gain}), with 95% confidence: *speculate* when a configuration's interval lies above 1 + {gain} "
            "(widened, *, for having picked the best of the k configurations tried); *plain decoding* when every "
            "configuration's interval lies below 1; *no gain worth having* when every configuration's one-sided "
            f"95% upper bound lies below 1 + {gain}; *inconclusive* otherwise, with the further prompts that would "
            "settle the likeliest verdict with 80% probability at the measured spread. Configurations measured on "
            "one prompt take no part. Each row names the best configuration (or the one to use) and its speedup "
            "against " + ("plain decoding run beside it, prompt by prompt" if params.get("paired")
                          else "the category's plain baseline")
            + "; [a, b] is the 95% interval from a bootstrap over the category's prompts and their steps."
            + sequential, "",
            table(rows, vary + ["category", "policy", "plain tok/s", "best (draft, gamma)", "speedup [95% CI]",
                                "verdict", "prompts", "settled by", "why"]), ""]


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


def _verdict_plot(run_dir: Path, rel: Path) -> list[str]:
    if not (run_dir / "plots" / VERDICT_PLOT).exists():
        return []
    return [f"![Best speedup per category with its 95% interval (predicted from every prompt where the run has a "
            f"replay)]({(rel / 'plots' / VERDICT_PLOT).as_posix()})", ""]


def _machine(plan: dict, rel: Path) -> list[str]:
    s = plan.get("system", {})
    lines = ["## Machine and run", "",
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
    lines += [f"- {b}" for b in [sections.budget_line(plan.get("budget"), plan.get("took_s"))] if b]
    lines += [f"- command: `{plan.get('command', '')}`", f"- raw traces: `{(rel / 'traces').as_posix()}` (one JSONL "
              "per configuration; every figure here is computed from them: `harness report RUN_DIR --check`)", ""]
    rows = [[n, m["quant"], mib(m["bytes"]) if m["bytes"] else "", m["sha256"][:12], m["note"]]
            for n, m in sorted(plan.get("models", {}).items())]
    return lines + ["### Models", "", table(rows, ["model", "quant", "size", "sha256", "note"]), ""]


def _failures(data: dict[str, pl.DataFrame]) -> list[str]:
    units = data.get("units")
    failed = [] if units is None else units.filter(~pl.col("status").is_in(["ok"]))
    if not len(failed):
        return []
    cfg = data["configs"]
    rows = [[r["unit"], r["draft_label"], r["gamma_label"], r["policy"], r["round"], r["status"], r["error"]]
            for r in failed.join(cfg.select("config", "draft_label", "gamma_label", "policy"), on="config", how="left")
            .iter_rows(named=True)]
    return ["## Configurations that did not finish", "",
            table(rows, ["unit", "draft", "gamma", "policy", "round", "status", "error"]), ""]


def _how_to_read() -> list[str]:
    return ["## How to read this", "",
            "- acceptance = accepted / proposed draft tokens; accepted/step = mean accepted draft tokens per "
            "verification step; alpha = mean of sum_x min(p, q) under the row's sampling policy over the "
            "positions verification reached (accepted drafts and each step's first rejection; under greedy, "
            "the rate at which draft and target argmax agree there). Three different figures: never compare "
            "one with another.",
            "- tokens/call = emitted tokens per target decode (accepted + the correction or bonus token).",
            "- speedup = tokens/s against plain decoding of the same target, policy, offload, threads and "
            "category, measured in the same run: in a paired run (`--paired`), against the plain generations "
            "run prompt by prompt beside this configuration's in its worker (plain tok/s, per row); otherwise "
            "against the category's plain baseline configuration.",
            "- intervals: 95%, from a bootstrap that resamples the category's prompts and, within each, the "
            "verification steps of every generation together with its plain twin; a t interval with the "
            "bootstrap's standard error and (prompts - 1) degrees of freedom. One prompt says nothing about how "
            "prompts differ, so it settles no verdict.",
            "- break-even = the acceptance rate at which this configuration's measured step cost "
            "(draft + verify + overhead) would match plain decoding: (step_ms / base_ms_per_token - 1) / gamma; "
            "'unreachable' when even 100% acceptance loses.",
            "- per-position: P(position i accepted | reached); rejections: where steps stopped (none = all "
            "accepted); by target confidence: acceptance of tested positions by the target's top probability.",
            ""]
