"""Many machines, one comparison (`harness compare RUN_DIR...`): each run's verdicts recomputed from its own traces,
side by side per category and policy, with a header per machine. Runs are put in one table only when they measured
the same thing: the same model files (sha256), the same prompts (ids, and contents where the runs recorded them)
and the same sampling policies; otherwise the command says what differs and stops."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from harness.errors import HarnessError
from harness.report.fmt import ci, table
from harness.rundir import plan_rounds, read_plan

KEY = ["target", "setup", "policy", "category"]


@dataclass
class Run:
    path: Path
    plan: dict
    verdicts: pl.DataFrame | None = None  # one row per (target, setup, offload, threads, policy, category)
    source: str = ""  # "replayed" (predicted from every prompt) or "timed"
    timed: pl.DataFrame | None = None  # its timed speculative rows: (config, category) -> speedup
    label: str = ""  # its name, told apart from another run's of the same name (labels)

    @property
    def name(self) -> str:
        return self.label or self.path.name

    def machine(self) -> dict:
        from harness.sysinfo import header
        return {"run": self.name} | header(self.plan.get("system", {})) | {"verdicts": self.source,
                                                                          "schema": self.plan.get("schema", 1),
                                                                          "engine": self.engine}

    @property
    def engine(self) -> str:
        """What measured it: the harness's own loop, or llama-server (--engine server) with the versions its rows
        name."""
        if self.plan.get("params", {}).get("engine", "harness") != "server":
            return "harness loop"
        from harness.rundir import finished
        versions = sorted({r["llama_server_version"].removeprefix("version: ") for r in finished(self.path).values()
                           if r.get("llama_server_version")})
        return " ".join(["llama-server", *versions[:1]]) + (f" (and {len(versions) - 1} more)" if len(versions) > 1
                                                            else "")


def labels(paths: list[Path]) -> list[str]:
    """Each run's directory name; where several share one (two hosts both called vm write runs of one name), the
    name with as many of its parent folders as tell them apart: "20261202-vm (hostA/runs)"."""
    names = [p.name for p in paths]
    out = list(names)
    for name in set(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) < 2:
            continue
        ups = {i: paths[i].resolve().parent.parts for i in group}
        k, most = 1, max(len(u) for u in ups.values())
        while len({ups[i][-k:] for i in group}) < len(group) and k < most:
            k += 1
        for i in group:
            out[i] = f"{name} ({Path(*ups[i][-k:])})"
    return out


def open_run(path: Path, label: str = "") -> Run:
    """A run directory's plan: what it measured, checked against the others before anything is computed."""
    if not path.is_dir():
        raise HarnessError(f"{path}: no such run directory")
    plan = read_plan(path)
    if "instances" not in plan or "models" not in plan:
        raise HarnessError(f"{path}: plan.json lacks {'instances' if 'instances' not in plan else 'models'} "
                           "(not a run this harness can compare)")
    return Run(path, plan, label=label)


def _holds_a_record(f: Path) -> bool:
    """Whether a trace, plain or gzipped, has a line that parses (trace.lines says what is damaged)."""
    from harness.trace import lines, parse
    for line in lines(f):
        try:
            parse(line)
            return True
        except ValueError:
            continue
    return False


def require_traces(run: Run) -> None:
    """Refuse a run where a finished unit's trace holds no record (an empty .gz, a file cut to nothing): its
    configuration would drop out of the verdicts without a word."""
    from harness.rundir import DRIFT_DIR, PAIRED_DIR, REPLAY_DIR, ok_units, trace_file
    mine = ok_units(run.path)
    for d, units in ((run.path, mine), (run.path / PAIRED_DIR, mine), (run.path / DRIFT_DIR, None),
                     (run.path / REPLAY_DIR, None)):
        for u in sorted(ok_units(d) if units is None else units):
            f = trace_file(d, u)
            if f is not None and not _holds_a_record(f):
                raise HarnessError(f"{run.path}: the trace {f.relative_to(run.path)} holds no record, so what {u} "
                                   "measured would be left out of the comparison: restore the file (from git, or the "
                                   "machine that ran it)")


def load_verdicts(run: Run) -> None:
    """Its verdicts recomputed from its traces: the replay's where the run has one (they rest on every prompt),
    else the timed ones."""
    from harness.report.tables import compute
    require_traces(run)
    data = compute(run.path)
    sweep = data.get("sweep")
    if sweep is not None:
        run.timed = sweep.filter((pl.col("draft") != "none") & pl.col("speedup").is_not_null()).select(
            "config", "category", "policy", "prompts", "speedup")
    replayed = data.get("replay_verdicts")
    if replayed is not None and len(replayed):
        run.verdicts = _answered(replayed.with_columns(pl.format("{} g={}", "proposer", "gamma").alias("best")),
                                 data, run.plan)
        run.source = "replayed"
        return
    v = data.get("verdicts")
    if v is None or not len(v):
        raise HarnessError(f"{run.path}: no verdict to compare (no speculative configuration finished)")
    run.verdicts = v.with_columns(pl.format("{} g={}", "draft_label", "gamma_label").alias("best"))
    run.source = "timed"


def _answered(v: pl.DataFrame, data: dict, plan: dict) -> pl.DataFrame:
    """Predicted verdicts as the run's answer gives them: one its timed run contradicted is replaced by what the
    answer says instead (the timed verdict, or inconclusive)."""
    from harness.report.answer import VARY, answers
    keys = (*VARY, "category", "policy")
    said = {tuple(a[k] for k in keys): a for a in answers(data, plan)}
    rows = []
    for r in v.iter_rows(named=True):
        a = said.get(tuple(r[k] for k in keys))
        if a is not None and a["verdict"] != r["verdict"]:
            r = r | {k: a[k] for k in ("verdict", "speedup", "lo", "hi")} | {"best": a["configuration"] or r["best"]}
        rows.append(r)
    return pl.DataFrame(rows, schema=v.schema)


def _models(run: Run) -> dict[str, str]:
    used = {i["target"] for i in run.plan["instances"]} | {i["draft"] for i in run.plan["instances"]}
    return {n: m.get("sha256", "") for n, m in run.plan["models"].items() if n in used}


def _policies(run: Run) -> set[str]:
    from harness.sampling import Policy
    return {Policy(**i["policy"]).label for i in run.plan["instances"]}


def _prompts(run: Run) -> dict[str, str | None]:
    ids = [i for r in plan_rounds(run.plan) for i in r]
    digests = run.plan.get("prompt_digests", {})
    return {i: digests.get(i) for i in ids}


def require_comparable(runs: list[Run]) -> list[str]:
    """Refuse runs that measured different things (one line naming the first difference); notes on what could
    not be checked."""
    if len(runs) < 2:
        raise HarnessError("compare needs at least two run directories")
    first, notes = runs[0], []
    for r in runs[1:]:
        a, b = _models(first), _models(r)
        for name in sorted(a.keys() | b.keys()):
            if name not in a or name not in b:
                has, lacks = (first, r) if name in a else (r, first)
                raise HarnessError(f"the runs differ in their models: {has.name} used {name}, {lacks.name} did not; "
                                   "compare runs of the same sweep")
            if a[name] != b[name]:
                raise HarnessError(f"the runs differ in their models: {name} has sha256 {a[name][:12]} in {first.name} "
                                   f"and {b[name][:12]} in {r.name} (a different file under the same name)")
        if _policies(first) != _policies(r):
            raise HarnessError(f"the runs differ in their sampling policies: {', '.join(sorted(_policies(first)))} in "
                               f"{first.name}, {', '.join(sorted(_policies(r)))} in {r.name}")
        pa, pb = _prompts(first), _prompts(r)
        if set(pa) != set(pb):
            only = sorted(set(pa) ^ set(pb))
            raise HarnessError(f"the runs differ in their prompts: {', '.join(only[:3])}"
                               f"{' ...' if len(only) > 3 else ''} in one of {first.name} and {r.name} only")
        changed = [i for i in pa if pa[i] and pb[i] and pa[i] != pb[i]]
        if changed:
            raise HarnessError(f"the runs differ in their prompts: {', '.join(changed[:3])} has other contents in "
                               f"{first.name} and {r.name}")
        if first.engine != r.engine:  # a column apart is then the engines' difference as much as the machines'
            notes.append(f"{first.name} was measured in the {first.engine}, {r.name} in the {r.engine}: their "
                         "columns differ by engine as well as by machine")
        if any(pa[i] is None or pb[i] is None for i in pa):
            notes.append(f"{first.name} or {r.name} predates prompt digests (schema 1): their prompts are compared "
                         "by id only")
    return notes


def frame(runs: list[Run]) -> pl.DataFrame:
    """The verdict rows of every run, tagged with their machine (run name)."""
    cols = KEY + ["ngl", "threads", "verdict", "best", "speedup", "lo", "hi", "adjusted", "prompts"]
    return pl.concat([r.verdicts.select(cols).with_columns(pl.lit(r.name).alias("run")) for r in runs],
                     how="vertical_relaxed")


def _cell(rows: list[dict]) -> str:
    """A machine's verdict for one (target, setup, policy, category): several lines where it ran several offload
    or thread settings."""
    out = []
    for r in rows:
        where = f"ngl {r['ngl']}, {r['threads'] or 'all'} thr: " if len(rows) > 1 else ""
        out.append(f"{where}{r['verdict']}: {r['best']} {ci(r['speedup'], r['lo'], r['hi'], unit='x')}"
                   + ("*" if r["adjusted"] else ""))
    return "<br>".join(out) or "not run"


def repeats(runs: list[Run]) -> list[str]:
    """Each later run's timed rows against the first run's, where both timed the same configuration on as many
    of the same prompts at the same length: how far one machine's timed rows repeat (analysis.repeat)."""
    from harness.analysis.repeat import TOL, repeatability
    a, out = runs[0], []
    for b in runs[1:]:
        if a.timed is None or b.timed is None or \
                a.plan["params"].get("max_tokens") != b.plan["params"].get("max_tokens"):
            continue
        both = a.timed.join(b.timed, on=["config", "category", "prompts"], suffix="_b")
        if not len(both):
            continue
        ratios = (both["speedup_b"] / both["speedup"]).to_list()
        r = repeatability(ratios)
        greedy = repeatability([x for x, p in zip(ratios, both["policy"]) if p == "greedy"])
        same = a.machine()["cpu"] == b.machine()["cpu"]
        line = (f"{b.name} against {a.name}: {r['rows']} timed rows in both (the same configuration and prompts); "
                f"their speedups within {TOL:.0%} of each other in {r['within']}, greedy {greedy['within']} of "
                f"{greedy['rows']}.")
        if same and r["row_error"] is not None:
            line += (f" Read as repeats on one kind of machine, one timed row is off by about "
                     f"{r['row_error']:.0%} of its speedup, and a prediction with no error of its own would fall "
                     f"within {TOL:.0%} of a timed row in about {r['ceiling']:.0%} of rows.")
        elif not same:
            line += " The CPUs differ, so this is the machines' difference as much as either's noise."
        out.append(line)
    return ["## Timed rows measured twice", "", *[f"- {x}" for x in out], ""] if out else []


def render(runs: list[Run], f: pl.DataFrame, notes: list[str], plot: str | None) -> str:
    head = [[chr(65 + i), m["run"], m["cpu"], m["cores"], m["ram_gib"], m["backend"], m["llama-cpp-python"],
             m["harness"], m["engine"], m["verdicts"]] for i, m in enumerate(r.machine() for r in runs)]
    rows = []
    for key, g in f.group_by(KEY, maintain_order=True):
        by = {r.name: [x for x in g.iter_rows(named=True) if x["run"] == r.name] for r in runs}
        rows.append([k for k, c in zip(key, KEY) if c != "setup"] + ([key[1] or "default"] if f["setup"].n_unique() > 1
                                                                     else []) + [_cell(by[r.name]) for r in runs])
    cols = [c for c in KEY if c != "setup"] + (["setup"] if f["setup"].n_unique() > 1 else [])
    lines = ["# Speculative decoding across machines", "",
             "Each machine's verdict per category and policy, recomputed from its run's traces: *speculate*, "
             "*plain decoding* or *inconclusive* at 95%, the best configuration (draft, gamma) and its speedup "
             "against plain decoding on that machine [95% interval]; * = widened for having picked the best of "
             "several. A replayed run's verdicts rest on every prompt (acceptance replayed, costs measured there); "
             "a timed run's on the prompts it timed.", ""]
    if plot:
        lines += [f"![speedup per machine]({plot})", ""]
    lines += [table(rows, cols + [f"{chr(65 + i)}" for i in range(len(runs))]), "", "## Machines", "",
              table(head, ["", "run", "CPU", "cores", "RAM GiB", "backend", "llama-cpp-python", "harness",
                           "engine", "verdicts"]), "",
              "The runs used the same model files (sha256), prompts and sampling policies; "
              "that is checked before anything is put side by side.", "", *repeats(runs)]
    return "\n".join(lines + [f"Note: {n}." for n in notes] + [""])


def speedup_plot(runs: list[Run], f: pl.DataFrame, out: Path) -> Path | None:
    from harness import plots
    if not plots.available():
        return None
    plt = plots._plt()
    groups = f.select(KEY).unique(maintain_order=True).rows()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(groups) * len(runs)), 3.8))
    width = 0.8 / len(runs)
    for j, r in enumerate(runs):
        xs, ys, err = [], [], [[], []]
        for i, key in enumerate(groups):
            x = f.filter((pl.col("run") == r.name) & pl.all_horizontal([pl.col(c) == v for c, v in zip(KEY, key)]))
            if not len(x) or x["speedup"][0] is None:
                continue
            s, lo, hi = x["speedup"][0], x["lo"][0], x["hi"][0]
            xs.append(i + (j - (len(runs) - 1) / 2) * width)
            ys.append(s)
            err[0].append(s - lo if lo is not None else 0)
            err[1].append(hi - s if hi is not None else 0)
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, label=f"{chr(65 + j)}: {r.name}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [f"{k[3]}\n{k[2]}" for k in groups], fontsize=6, rotation=90)
    ax.set_ylabel("best speedup vs plain [95% CI]")
    ax.legend(fontsize=6)
    return plots.save(fig, out / "compare.png")


def compare_command(run_dirs: list[str], out: str, formats: tuple[str, ...]) -> Path:
    """Write out/compare.md (and compare.<fmt> tables); return the Markdown file's path."""
    bad = [x for x in formats if x not in ("md", "csv", "json", "parquet")]
    if bad:
        raise HarnessError(f"unknown format '{bad[0]}' (md, csv, json, parquet)")
    from harness.errors import check_out_dir
    check_out_dir(out)
    seen: dict[Path, str] = {}
    for d in run_dirs:
        key = Path(d).resolve()
        if key in seen:
            twice = f"{d} is given twice" if seen[key] == d else f"{seen[key]} and {d} are the same run"
            raise HarnessError(f"{twice}: compare each run once")
        seen[key] = d
    paths = [Path(d) for d in run_dirs]
    runs = [open_run(p, label) for p, label in zip(paths, labels(paths))]
    notes = require_comparable(runs)
    for r in runs:
        load_verdicts(r)
    f = frame(runs)
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    plot = speedup_plot(runs, f, dest)
    md = dest / "compare.md"
    md.write_text(render(runs, f, notes, plot.name if plot else None))
    machines = [r.machine() for r in runs]
    for fmt in formats:
        if fmt == "csv":
            f.write_csv(dest / "compare.csv")
        elif fmt == "parquet":
            f.write_parquet(dest / "compare.parquet")
        elif fmt == "json":
            (dest / "compare.json").write_text(json.dumps({"machines": machines, "verdicts": f.to_dicts()}, indent=1,
                                                          default=str))
    return md
