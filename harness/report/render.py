"""The Markdown report, made for its user. The first screen answers the question: the answer per category in words
with its interval (and the llama-server command of each "speculate"), one verdict table, one plot and the memory
each configuration took; then a table of contents, and sections of about a screen each. The harness's checks of
itself are in the run's diagnostics.md (report.diagnostics), which the contents link to in one line."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from harness import checkrows
from harness.models.arch import words
from harness.report import answer, bottomline, concurrency, llamaserver, replayed, sections
from harness.report.diagnostics import DIAGNOSTICS
from harness.report.fmt import contents, mib, table, wrap
from harness.rundir import read_plan

VERDICT_PLOT = "verdicts.png"


def render_markdown(run_dir: Path, data: dict[str, pl.DataFrame], md_dir: Path) -> str:
    """The report of run_dir, to be written in md_dir (paths in it are relative to that directory)."""
    plan = read_plan(run_dir)
    rel = Path(os.path.relpath(run_dir.resolve(), md_dir.resolve()))
    sweep = data.get("sweep")
    first = ["# Should I use speculative decoding here?", "", *wrap([_summary(plan)]), ""]
    if sweep is None or not len(sweep):
        first += ["No configuration finished.", ""]
        body = _machine(plan, rel)
    else:
        # the bottom line per target (over every prompt at once), the targets side by side, what it rests on and
        # its plot; then the answer per category in words, and its table: with a replay, the verdicts predicted
        # from every prompt (the timed ones check them, in the diagnostics), else the timed ones (pooled over
        # the categories for the bottom line).
        rows = answer.answers(data, plan)
        bottom = answer.answers(data, plan, pooled=True)
        models = plan.get("models", {})
        memory, memory_detail = sections.memory(sweep)
        said = answer.section(rows, models, _server_line(run_dir, plan, rel),
                              "## The answer per category" if bottom else "## The answer")
        tables = (replayed.verdict_table(data) or sections.timed_verdicts(data.get("verdicts"))) + \
            llamaserver.pooled_section(data.get("server_pooled")) + memory
        if bottom:
            first += wrap(bottomline.section(bottom, rows, models, bottomline.commands)
                          + bottomline.quantization(bottom, models, sweep)
                          + bottomline.evidence(plan, sweep, bottom)) + _verdict_plot(run_dir, rel)
            per_category = said + tables
        else:
            first += said + _verdict_plot(run_dir, rel) + tables
            per_category = []
        body = per_category + answer.how_to_run(rows) + _how_verdicts(data, plan) + replayed.sections(data, plan) + \
            sections.until_confident(plan, data.get("verdicts")) + concurrency.section(data, run_dir, rel) + \
            _machine(plan, rel) + memory_detail + \
            sections.plots(run_dir, md_dir)
    body += _failures(data) + _how_to_read()
    checks = (f"[Diagnostics]({(rel / DIAGNOSTICS).as_posix()}): the harness's checks of itself (its predictions "
              "against its own timings, the timing floor, machine noise and drift, output equivalence) and every "
              "timed row")
    return "\n".join(first + contents(first, body, checks) + body)


def _server_line(run_dir: Path, plan: dict, rel: Path) -> str:
    """The llama-server check in one line: what ran and where its table is, or why it did not run."""
    why = (plan.get("server_check") or {}).get("not_run")
    if why:
        return f"Not run in llama-server (`--server-check`): {why}"
    if not (run_dir / checkrows.JSON).exists():
        return ""
    return (f"Each answer's configuration also ran in llama-server, as its command gives it, beside its plain twin "
            f"on the same prompts ([{llamaserver.MD}]({(rel / llamaserver.MD).as_posix()}): the table and its rule).")


def _how_verdicts(data: dict[str, pl.DataFrame], plan: dict) -> list[str]:
    """How the verdicts above are reached: the rule, and for a run with a replay, what the prediction is."""
    return ["## How the verdicts are reached", "", *sections.verdict_rules(plan), *replayed.verdict_rules(data, plan)]


def _summary(plan: dict) -> str:
    s, p = plan.get("system", {}), plan.get("params", {})
    sweeps = [p, *p.get("also", [])]  # a further sweep's lists replace the main one's, the rest inherited
    models = plan.get("models", {})
    names = list(dict.fromkeys(t for q in sweeps for t in q.get("target", p.get("target", []))))
    arch = {words(m["arch"]) for t in names if (m := models.get(t, {})).get("arch")}
    # one architecture for all is said once; the answer per category says what each means
    targets = ", ".join(names) + (f" ({arch.pop()})" if len(arch) == 1 else "") if len(arch) <= 1 else \
        ", ".join(t + (f" ({words(models[t]['arch'])})" if models.get(t, {}).get("arch") else "") for t in names)
    drafts = list(dict.fromkeys(d for q in sweeps for d in q.get("draft", p.get("draft", [])) if d != "none"))
    given = [str(g) for g in p.get("gamma", [])]
    gammas = sorted({int(g) for g in given if g.isdigit()})  # fixed ones; adaptive ones (auto:4) as written
    ranged = len(gammas) > 2 and gammas == list(range(gammas[0], gammas[-1] + 1))
    gamma = ", ".join(([f"{gammas[0]}-{gammas[-1]}"] if ranged else list(map(str, gammas)))
                      + list(dict.fromkeys(g for g in given if not g.isdigit())))
    # a long list of drafts is counted here; "Machine and run" and the tables name them
    said = f"drafts {', '.join(drafts) or 'none'}" if len(drafts) < 4 else f"{len(drafts)} drafts"
    return (f"Target{'s' * (len(names) > 1)} {targets}; {said}; gamma {gamma}; "
            f"{s.get('cpu', 'unknown CPU')}, {s.get('cores_physical')} cores, {s.get('backend', '')}; "
            f"{s.get('date', '')}.")


def _verdict_plot(run_dir: Path, rel: Path) -> list[str]:
    if not (run_dir / "plots" / VERDICT_PLOT).exists():
        return []
    return [f"![Best speedup and its 95% interval]({(rel / 'plots' / VERDICT_PLOT).as_posix()})", ""]


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
    models = sorted(plan.get("models", {}).items())
    arch = any(m.get("arch") for _, m in models)  # runs from before the facts were read keep their layout
    rows = [[n, m["quant"], mib(m["bytes"]) if m["bytes"] else "", *([words(m["arch"]) if m.get("arch") else ""]
             if arch else []), m["sha256"][:12], m["note"]] for n, m in models]
    head = ["model", "quant", "size", *(["architecture"] if arch else []), "sha256", "note"]
    return lines + ["### Models", "", table(rows, head), ""]


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
