"""A machine's verdicts from its calibration alone (`harness predict RUN_DIR --costs CAL...`): acceptance depends on
the models, prompts and policy, which a run's replay measured from every prompt; cost depends on the machine, which
`harness calibrate` measures there in minutes. The replay's own costs are swapped for the calibrated ones and the
predictions recomputed; with --against, a timed run on that machine is put beside them."""
from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from harness.analysis.noise import unit_summary
from harness.costmodel import with_unit_costs
from harness.errors import HarnessError
from harness.report.fmt import ci, f, table
from harness.report.verdicts import LEVEL_BASELINE, LEVEL_BUSY
from harness.rundir import REPLAY_DIR, load_records, ok_units, plan_rounds, read_plan

KEY = ["target", "category", "policy", "proposer", "gamma"]


def load_calibrations(paths: list[str]) -> tuple[dict[str, dict], dict]:
    """{model name: calibration} and the machine they were taken on; all from one machine and thread count."""
    cals, machine = {}, None
    for p in paths:
        try:
            c = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise HarnessError(f"--costs {p}: cannot read a calibration ({e})") from None
        if not isinstance(c, dict):
            raise HarnessError(f"--costs {p}: holds a JSON {type(c).__name__}, not a calibration (an object written by "
                               "`harness calibrate`): give the file that command saved")
        if "machine" not in c or "ms_last_by_context" not in c:
            raise HarnessError(f"--costs {p}: a calibration from before they carried their machine: run "
                               f"`harness calibrate {c.get('model', 'MODEL')}` again on that machine")
        _require_costs(p, c)
        here = c["machine"] | {"threads": c["threads"], "ngl": c["ngl"]}
        if machine is not None and {k: here[k] for k in ("cpu", "host", "threads", "ngl")} != \
                {k: machine[k] for k in ("cpu", "host", "threads", "ngl")}:
            raise HarnessError(f"--costs {p}: taken on {here['host']} ({here['threads']} threads, ngl {here['ngl']}), "
                               f"the others on {machine['host']} ({machine['threads']} threads, ngl {machine['ngl']}): "
                               "give one machine's calibrations")
        machine = here
        cals[c["model"]] = c
    if not cals:
        raise HarnessError("give the other machine's calibrations with --costs FILE (one per model)")
    return cals, machine


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _require_costs(p: str, c: dict) -> None:
    """A calibration's fields as `harness calibrate` writes them, each refused in one line naming the file: the
    contexts it timed at (a non-empty increasing list), k = 1..N, one positive time per k at each context (a zero
    would divide by zero), its machine."""
    fields = ("model", "threads", "ngl", "contexts", "k", "ms_by_context", "ms_last_by_context")
    missing = [f for f in fields if f not in c]
    if missing:
        raise HarnessError(f"--costs {p}: not a whole calibration (no {', '.join(missing)}): run `harness calibrate` "
                           "again on that machine")
    again = "run `harness calibrate` again on that machine"
    m = c["machine"]
    lacks = [k for k in ("host", "cpu", "date", "llama-cpp-python") if k not in m] if isinstance(m, dict) else None
    if lacks is None or lacks:
        raise HarnessError(f"--costs {p}: its machine record lacks {', '.join(lacks) if lacks else 'its fields'}: "
                           f"{again}")
    def whole(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0
    for k, ok in (("model", isinstance(c["model"], str) and c["model"]), ("threads", whole(c["threads"])),
                  ("ngl", whole(c["ngl"]))):
        if not ok:
            raise HarnessError(f"--costs {p}: its {k} is {c[k]!r}, not what `harness calibrate` writes: {again}")
    ctx = c["contexts"]
    if not isinstance(ctx, list) or not ctx:
        raise HarnessError(f"--costs {p}: its contexts list is {'empty' if ctx == [] else repr(ctx)}, so it holds no "
                           f"cost at any context: {again}")
    if not all(_number(x) and x > 0 for x in ctx) or any(a >= b for a, b in zip(ctx, ctx[1:])):
        raise HarnessError(f"--costs {p}: its contexts {ctx!r} are not an increasing list of token counts above 0: "
                           f"{again}")
    n = len(c["k"]) if isinstance(c["k"], list) else 0
    if not n or c["k"] != list(range(1, n + 1)):
        raise HarnessError(f"--costs {p}: its k {c['k']!r} is not 1..N (the block sizes it timed): {again}")

    def shaped(r, ok) -> bool:  # one row per context, one value per k
        return isinstance(r, list) and len(r) == len(ctx) and all(
            isinstance(row, list) and len(row) == n and all(_number(x) and ok(x) for x in row) for row in r)
    if not all(shaped(c[k], lambda x: x > 0) for k in ("ms_by_context", "ms_last_by_context")):
        raise HarnessError(f"--costs {p}: its decode costs are not one positive time per k and context ({len(ctx)} "
                           f"context(s), k up to {n}; a zero or a missing time cannot be a cost): {again}")
    spread = [k for k in ("ms_sd_by_context", "ms_last_sd_by_context") if c.get(k) is not None
              and not shaped(c[k], lambda x: x >= 0)]
    if spread:
        raise HarnessError(f"--costs {p}: its {spread[0]} is not one spread (0 or more) per k and context: {again}")


def _require_match(plan: dict, cals: dict[str, dict], run: str) -> None:
    from harness.specs import parse_draft
    drafts = {parse_draft(i["draft"]).model for i in plan["instances"]}
    models = {i["target"] for i in plan["instances"]} | drafts - {None}
    for name in cals:
        if name not in models:
            raise HarnessError(f"--costs: a calibration of {name}, which {run} did not use (it used "
                               f"{', '.join(sorted(models))})")
        want = plan["models"].get(name, {}).get("sha256", "")
        if want and cals[name].get("sha256") and cals[name]["sha256"] != want:
            raise HarnessError(f"--costs: the calibration of {name} is of another file (sha256 "
                               f"{cals[name]['sha256'][:12]}, the run's {want[:12]})")
    missing = sorted(models - set(cals))
    if missing:
        raise HarnessError(f"--costs: no calibration of {', '.join(missing)}: run `harness calibrate {missing[0]}` "
                           "on that machine and give its file")


def swapped_costs(records: list[dict], cals: dict[str, dict], targets: dict[str, str], gamma_max: int) -> list[dict]:
    """The replay records with each costs record's decode costs replaced by the calibrated ones (the loop's
    per-step overhead and an n-gram lookup's time stay the run's: the harness's own Python, not llama.cpp)."""
    k = gamma_max + 1
    out = []
    for r in records:
        if r.get("type") != "costs":
            out.append(r)
            continue
        t = cals[targets[r["config"]]]
        d = cals.get(r["proposer"])
        if len(t["k"]) < k or (d and len(d["k"]) < k):
            raise HarnessError(f"--costs: the calibrations reach k = {len(t['k'])}; the replay needs {k}: calibrate "
                               f"with --k-max {k}")
        # the calibration's own repetition spread, where it recorded one (none from the run's machine)
        unit = {"contexts": t["contexts"], "reps": t.get("reps"),
                "target_ms_by_context": [row[:k] for row in t["ms_by_context"]],
                "target_sd_by_context": _cut(t.get("ms_sd_by_context"), k)}
        if d:
            unit |= {"draft_ms_by_context": [row[:k] for row in d["ms_last_by_context"]],
                     "draft_sd_by_context": _cut(d.get("ms_last_sd_by_context"), k)}
        out.append(with_unit_costs({x: v for x, v in r.items() if x != "reps"},
                                   {x: v for x, v in unit.items() if v is not None}))
    return out


def _cut(rows: list[list[float]] | None, k: int) -> list[list[float]] | None:
    return None if rows is None else [row[:k] for row in rows]


def predict(run_dir: Path, cal_paths: list[str], against: Path | None = None) \
        -> tuple[pl.DataFrame, pl.DataFrame | None, dict]:
    """Predictions for the calibrated machine from every prompt; with against, the timed speedups measured there
    beside them, and the predictions again on the timed run's own prompts (None without)."""
    from harness.analysis.predict import predictions
    from harness.instance import Instance
    cals, machine = load_calibrations(cal_paths)  # the --costs files first: they need no run to be refused
    plan = read_plan(run_dir)
    units = ok_units(run_dir / REPLAY_DIR) if (run_dir / REPLAY_DIR).is_dir() else set()
    if not units:
        how = "which --engine server does not take: bench the same configurations with --engine harness --replay" \
            if plan.get("params", {}).get("engine") == "server" else "harness bench --replay"
        raise HarnessError(f"{run_dir} has no replay: predictions for another machine need acceptance replayed from "
                           f"every prompt ({how})")
    _require_match(plan, cals, run_dir.name)
    insts = {i.id: i for i in (Instance.from_dict(d) for d in plan["instances"])}
    gamma_max = plan["params"].get("replay_gamma", 8)
    records = swapped_costs(load_records(run_dir / REPLAY_DIR, units), cals,
                            {c: i.target for c, i in insts.items()}, gamma_max)


    busy = sorted(name for name, c in cals.items() if "noise" in c and unit_summary(c["noise"])["busy"])

    def frame(recs: list[dict]) -> pl.DataFrame:  # plain decoding costs what the calibration's k = 1 costs
        return pl.DataFrame(predictions(recs, {}, gamma_max), infer_schema_length=None).with_columns(
            pl.when(pl.col("config").replace_strict({c: i.target for c, i in insts.items()}, default=None)
                    .is_in(busy) | pl.col("draft").is_in(busy)).then(pl.lit(LEVEL_BUSY))
            .otherwise(pl.lit(LEVEL_BASELINE)).alias("levelled"),
            pl.lit(f"the calibration of {', '.join(busy)} was measured while other processes used the CPU")
            .alias("busy_why"),
            pl.col("config").replace_strict({c: i.target for c, i in insts.items()}, default=None).alias("target"),
            pl.col("config").replace_strict({c: i.setup for c, i in insts.items()}, default="").alias("setup"),
            pl.col("config").replace_strict({c: i.ngl for c, i in insts.items()}, default=0).alias("ngl"),
            pl.lit(machine["threads"]).alias("threads"))
    pred = frame(records)
    if against is None:
        return pred.with_columns(*[pl.lit(None, pl.Float64).alias(f"timed_speedup{s}") for s in ("", "_lo", "_hi")]), \
            None, machine
    timed_plan = read_plan(against)
    timed, used = _timed(against, timed_plan, machine)
    # like for like: the replay again on the very prompts the timed run used
    same = frame([r for r in records if r.get("type") == "costs" or r.get("prompt_id") in used])
    machine = machine | {"apart": apart(cals, timed_plan)}
    return beside(pred, timed, "left"), beside(same, timed, "inner"), machine


def beside(pred: pl.DataFrame, timed: pl.DataFrame, how: str) -> pl.DataFrame:
    """The timed rows beside the predictions of the same target and configuration: a replay of several targets
    predicts each, and a timed run may have timed any of them."""
    return pred.join(timed, on=KEY + ["adaptive"], how=how)


def taken_at(c: dict) -> float | None:
    """When a calibration was taken (seconds since the epoch): its own record, else its machine's UTC date."""
    from datetime import datetime, timezone
    if "taken" in c:
        return c["taken"]
    date = c.get("machine", {}).get("date", "")
    if not date.endswith(" UTC"):  # a local time of an unknown zone
        return None
    return datetime.strptime(date[:-4], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def apart(cals: dict[str, dict], plan: dict) -> str:
    """How far from the timed run the calibrations of the models it timed were taken: a VM's pace moves over
    hours, and a prediction carries the pace of its calibrations' moment."""
    start = plan.get("started")
    timed = {m for i in plan.get("instances", []) for m in (i["target"], i["draft"])}
    times = [taken_at(c) for m, c in cals.items() if m in timed]
    if start is None or not times or None in times:
        return ""
    end = start + plan.get("took_s", {}).get("total", 0.0)
    gaps = [t - end if t > end else t - start if t < start else 0.0 for t in times]
    far = max(gaps, key=abs)
    if not far:
        return " The calibrations were taken while the timed run ran."
    hours, when = abs(far) / 3600, "after it ended" if far > 0 else "before it began"
    span = f"{hours:.1f} h" if hours >= 1 else f"{abs(far) / 60:.0f} min"
    return f" The calibrations were taken up to {span} {when}" + (
        ": a machine's pace can move in that time, and the prediction carries the pace of their moment."
        if hours >= 0.5 else ".")


def _timed(against: Path, plan: dict, machine: dict) -> tuple[pl.DataFrame, set[str]]:
    """The timed rows of a run on the calibrated machine, keyed like the predictions; the prompts it timed."""
    from harness.report.tables import compute
    if plan.get("system", {}).get("host") != machine["host"]:
        raise HarnessError(f"--against {against.name}: run on {plan.get('system', {}).get('host')}, the calibrations "
                           f"on {machine['host']}: time the run on the calibrated machine")
    sweep = compute(against).get("sweep")
    if sweep is None or not len(sweep):
        raise HarnessError(f"--against {against.name}: no configuration finished there")
    threads = {t or plan["system"].get("cores_physical") for t in sweep["threads"].unique()}
    if threads != {machine["threads"]}:
        raise HarnessError(f"--against {against.name}: timed at {', '.join(map(str, sorted(threads)))} threads, the "
                           f"calibrations at {machine['threads']}: time and calibrate alike")
    used = {i for r in plan_rounds(plan) for i in r}
    return sweep.filter(pl.col("draft") != "none").select(
        "target", "category", "policy", pl.col("draft_label").alias("proposer"), "gamma", "adaptive",
        pl.col("speedup").alias("timed_speedup"), pl.col("speedup_lo").alias("timed_speedup_lo"),
        pl.col("speedup_hi").alias("timed_speedup_hi"), pl.col("acceptance_rate").alias("timed_acceptance_rate"),
        pl.col("threads").alias("timed_threads")), used


def _within(rows: pl.DataFrame) -> int:
    """Rows whose predicted speedup lies within 10% of the timed one."""
    return sum(abs(r["speedup"] / r["timed_speedup"] - 1) <= 0.10 for r in rows.iter_rows(named=True))


def render(run: str, same: pl.DataFrame | None, verdicts: pl.DataFrame, machine: dict, against: str | None) -> str:
    from harness.report.replayed import confirmation, per_target

    def verdict_table(v: pl.DataFrame) -> list[str]:
        rows = [[x["category"], x["policy"], f"{x['proposer']} g={x['gamma']}",
                 ci(x["speedup"], x["lo"], x["hi"], unit="x") + ("*" if x["adjusted"] else ""), x["verdict"],
                 x["prompts"]] + ([confirmation(x)] if against else []) for x in v.iter_rows(named=True)]
        return [table(rows, ["category", "policy", "best predicted", "speedup [95% CI]", "verdict", "prompts"]
                      + (["timed there"] if against else [])), ""]

    def against_table(b: pl.DataFrame) -> list[str]:
        rows = [[r["category"], r["policy"], r["proposer"], r["gamma"], f(r["acceptance_rate"], ".0%"),
                 f(r["timed_acceptance_rate"], ".0%"), ci(r["speedup"], r["speedup_lo"], r["speedup_hi"], unit="x"),
                 ci(r["timed_speedup"], r["timed_speedup_lo"], r["timed_speedup_hi"], unit="x"),
                 f"{r['speedup'] / r['timed_speedup'] - 1:+.0%}"] for r in b.sort(KEY).iter_rows(named=True)]
        return [table(rows, ["category", "policy", "proposer", "gamma", "acceptance", "(timed)", "predicted", "timed",
                             "error"]), ""]
    out = [f"# Predicted for {machine['host']} ({machine['cpu']}, {machine['threads']} threads, ngl {machine['ngl']})",
           "", f"Acceptance replayed in {run} (every prompt; the models, prompts and policies of that run), decode "
           f"costs calibrated on this machine by `harness calibrate` ({machine['date']}, llama-cpp-python "
           f"{machine['llama-cpp-python']}); the loop's own per-step overhead is the run's. Verdicts as in a report "
           "(95%, widened for the best of all proposers and gammas).", "", *per_target(verdicts, verdict_table)]
    if same is not None:
        both = same.filter(pl.col("timed_speedup").is_not_null() & ~pl.col("adaptive"))
        close = _within(both)
        meet = sum(r["speedup_lo"] <= r["timed_speedup_hi"] and r["timed_speedup_lo"] <= r["speedup_hi"]
                   for r in both.iter_rows(named=True) if r["timed_speedup_lo"] is not None)
        greedy = both.filter(pl.col("policy") == "greedy")
        alike = greedy.filter((pl.col("acceptance_rate") - pl.col("timed_acceptance_rate")).abs() <= 1e-9)
        near = _within(alike)
        ties = (f" Under greedy decoding the two took the same steps where their acceptances agree, {len(alike)} of "
                f"{len(greedy)} greedy rows, {near} of them within 10%; elsewhere a near-tie between the target's top "
                "two tokens fell the other way on the other machine's kernels, and the text decoded from there "
                "differs.") if len(greedy) else ""
        out += [f"## Predicted against timed ({against})", "",
                "Each configuration the timed run measured, predicted again from the replay of the very prompts it "
                f"timed: {close} of {len(both)} rows within 10%; the intervals meet in {meet}.{ties}"
                f"{machine.get('apart', '')}", "", *per_target(both, against_table)]
    return "\n".join(out)


def predict_command(run_dir: str, cal_paths: list[str], against: str | None, out: str) -> Path:
    from harness.errors import check_out_dir
    from harness.report.replayed import predicted_verdicts
    check_out_dir(out)
    rd = Path(run_dir)
    if not rd.is_dir():
        raise HarnessError(f"{run_dir}: no such run directory")
    if against and not Path(against).is_dir():
        raise HarnessError(f"--against {against}: no such run directory")
    pred, same, machine = predict(rd, cal_paths, Path(against) if against else None)
    verdicts = predicted_verdicts(pred).sort(pl.col("policy") != "greedy", "policy", maintain_order=True)
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    md = dest / f"predict-{rd.name}-{machine['host']}-t{machine['threads']}.md"
    md.write_text(render(rd.name, same, verdicts, machine, Path(against).name if against else None))
    pred.drop([c for c in pred.columns if isinstance(pred[c].dtype, pl.List)]).write_csv(md.with_suffix(".csv"))
    return md
