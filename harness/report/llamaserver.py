"""crosscheck.md (the side-by-side table of crosscheck.json's rows, checkrows) in the run directory, and the
frames the report makes of those rows. section() gives the Markdown lines, for the report too."""
from __future__ import annotations

from pathlib import Path

from harness.analysis.serverstats import CONTRADICTED, HOLDS, NOT_CHECKED, UNSETTLED, rate, ratios
from harness.checkrows import RULE, load
from harness.report.fmt import ci, pct_ci, table

MD = "crosscheck.md"
VARY = ("target", "ngl", "threads", "setup")


def tool(row: dict) -> str:
    v = (row.get("tool") or "").removeprefix("version: ")
    return f"llama-server {v}".strip() if v else ""


def share(rows: list[dict]) -> str:
    """'2 of 3 verdicts checked hold in llama.cpp (1 unsettled)'."""
    checked = [r for r in rows if (r.get("llama") or {}).get("holds") not in (None, NOT_CHECKED)]
    if not checked:
        return "No verdict to check here: every row is inconclusive or not measured."
    n = {k: sum(r["llama"]["holds"] == k for r in checked) for k in (HOLDS, CONTRADICTED, UNSETTLED)}
    rest = ", ".join(f"{v} {k}" for k, v in n.items() if k != HOLDS and v)
    return (f"{n[HOLDS]} of {len(checked)} verdict{'s' * (len(checked) > 1)} checked "
            f"hold{'s' * (len(checked) == 1)} in llama.cpp ({n[HOLDS] / len(checked):.0%})"
            + (f"; {rest}" if rest else "") + ".")


def _row(r: dict, vary: list[str]) -> list:
    h, x = r.get("harness") or {}, r.get("llama") or {}
    where = [", ".join(f"{k} {r.get(k)}" for k in vary)] if vary else []
    if r.get("skip"):
        return [*where, r["category"], r["policy"], r["verdict"], r.get("configuration") or "",
                ci(h.get("speedup"), h.get("lo"), h.get("hi"), unit="x"),
                pct_ci(h.get("acceptance"), h.get("acceptance_lo"), h.get("acceptance_hi")),
                f"not checked: {r['skip']}", "", "", "", "", ""]
    eq = x.get("same_output")
    return [*where, r["category"], r["policy"], r["verdict"], r.get("configuration") or "",
            ci(h.get("speedup"), h.get("lo"), h.get("hi"), unit="x"),
            pct_ci(h.get("acceptance"), h.get("acceptance_lo"), h.get("acceptance_hi")),
            ci(x.get("speedup"), x.get("lo"), x.get("hi"), unit="x"),
            pct_ci(x.get("acceptance"), x.get("acceptance_lo"), x.get("acceptance_hi")) or "none drafted",
            x.get("reading", ""), x.get("holds", ""), f"{x.get('prompts', 0)}" + (f" ({eq[0]}/{eq[1]} same)" if eq
                                                                                    and eq[1] else ""), tool(r)]


HEADERS = ["category", "policy", "verdict", "configuration", "harness speedup [95% CI]", "harness acceptance",
           "llama.cpp speedup [95% CI]", "llama.cpp acceptance", "llama.cpp says", "holds",
           "prompts (same output)", "tool"]


def section(rows: list[dict], run: str = "", heading: str = "## Verdicts in llama.cpp") -> list[str]:
    """The Markdown lines: what was run, the rule, the table, the share of verdicts that hold."""
    if not rows:
        return []
    return [heading, "",
             f"Each configuration the answers name{f' in run `{run}`' if run else ''}, run in llama.cpp's own "
             "llama-server with the command the report gives, and plain (the same command without the --spec-* "
             "flags) after it or before it, one request per prompt on the run's prompts of that category, as the "
             "harness's token ids. "
             "Speed is the server's own (predicted_n - 1) / predicted_ms; the speedup is the geometric mean of the "
             "per-prompt ratios, acceptance is draft_n_accepted / draft_n. \"same output\": prompts whose "
             "speculative and plain outputs were the same tokens.", "", RULE, "", *summary(rows), ""]


def summary(rows: list[dict]) -> list[str]:
    """The table and the share of verdicts that hold (what crosscheck prints)."""
    vary = [k for k in VARY if len({str(r.get(k)) for r in rows}) > 1]
    return [table([_row(r, vary) for r in rows], (["where"] if vary else []) + HEADERS), "", share(rows)]


def write_md(run_dir: Path, rows: list[dict]) -> Path:
    from harness.errors import naming
    path = run_dir / MD
    with naming(path, run=run_dir):
        path.write_text("\n".join(section(rows, run_dir.name, heading="# Verdicts in llama.cpp")))
    return path


def spec_flags(words: list[str]) -> str:
    """The --spec-* flags of a llama-server command line (its words), each with its value."""
    return " ".join(f for i, f in enumerate(words) if f.startswith("--spec-") or
                    (i and words[i - 1].startswith("--spec-") and not f.startswith("-")))


def frame(run_dir: Path):
    """crosscheck.json's rows as the answer reads them, one per configuration and category: where, the config
    id, llama-server's flags of its speculative type (--spec-*), its figures, or why it was not measured. None
    where the run has no such file."""
    import polars as pl
    rows = load(run_dir)
    if not rows:
        return None
    out = []
    for r in rows:
        x = r.get("llama") or {}
        flags = r.get("speculative_command") or []
        spec = spec_flags(flags)
        same = x.get("same_output") or [None, None]
        paces = [v for p in r.get("prompts") or [] if (v := rate(p.get("plain")))]
        out.append({k: r.get(k) for k in (*VARY, "category", "policy", "config")}
                   | {"server_flags": spec, "server_speedup": x.get("speedup"), "server_lo": x.get("lo"),
                      "server_plain_tps": sum(paces) / len(paces) * 1000 if paces else None,
                      "server_ratios": ratios(r.get("prompts") or []), "server_tool": tool(r),
                      "server_binary": r.get("binary"),
                      "server_hi": x.get("hi"), "server_acceptance": x.get("acceptance"),
                      "server_reading": x.get("reading"), "server_holds": x.get("holds"),
                      "server_prompts": x.get("prompts"), "server_same": same[0], "server_compared": same[1],
                      "server_skip": r.get("skip") or None})
    return pl.DataFrame(out, infer_schema_length=None)


def pooled(records: list[dict], p_records: list[dict], cfg, noise):
    """--engine server: each speculative configuration over every request it served, the categories pooled (the
    run's mix of prompts), with serverstats' figures: the geometric mean of the per-request speedups against the
    plain twin with its t interval, and acceptance. Where a category has two prompts its interval stands on one
    degree of freedom; pooled, on all of them. `busy` where a unit of it ran beside foreign load (noise_frame).
    None where no request carries a server's figures."""
    import polars as pl
    from harness.analysis.serverstats import acceptance, speedup
    twin = {(r.get("config"), r["prompt_id"], r["repeat"]): r["server"] for r in p_records
            if r.get("type") == "generation" and r.get("server")}
    by: dict[str, list[dict]] = {}
    for r in records:
        if r.get("type") == "generation" and r.get("server") and r.get("mode") == "speculative":
            by.setdefault(r["config"], []).append(
                {"speculative": r["server"], "plain": twin.get((r["config"], r["prompt_id"], r["repeat"]))})
    if not by:
        return None
    rows = [{"config": c} | speedup(p) | acceptance(p) for c, p in by.items()]
    out = pl.DataFrame(rows, infer_schema_length=None).join(
        cfg.select("config", "draft_label", "gamma_label", "policy", "target"), on="config", how="left").join(
        noise.select("config", "busy"), on="config", how="left")
    return out.sort(["target", "policy", "speedup"], descending=[False, False, True], nulls_last=True)


def pooled_section(frame) -> list[str]:
    """The pooled figures as a table under the verdicts: a configuration's standing over the whole prompt mix, where
    the per-category intervals of a few prompts each say little."""
    if frame is None or not len(frame):
        return []
    several = frame["target"].n_unique() > 1
    rows = [([r["target"]] if several else []) + [
        r["policy"], f"{r['draft_label']} g={r['gamma_label']}" + (" (busy)" if r["busy"] else ""),
        ci(r["speedup"], r["lo"], r["hi"], unit="x"),
        pct_ci(r["acceptance"], r["acceptance_lo"], r["acceptance_hi"]) or "none drafted", r["prompts"]]
        for r in frame.iter_rows(named=True)]
    head = (["target"] if several else []) + ["policy", "configuration", "speedup [95% CI]", "accepted", "requests"]
    return ["Over every category at once (the run's mix of prompts), in llama-server: each configuration's speedup "
            "is the geometric mean of its requests' against their plain twins, with a t interval over all of them.",
            "", table(rows, head), ""] + (["(busy): it ran while other processes took the cores; `harness bench "
                                          "--resume RUN --rerun-busy` measures it again.", ""]
                                         if frame["busy"].any() else [])
