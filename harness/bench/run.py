"""`harness bench`: check everything up front, make sure the machine is idle, then run each unit of work (a
configuration over a round of prompts) in a worker while watching the machine, add rounds while verdicts are
open (--until-confident), run the plain baselines once more (drift), and report."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from collections import Counter
from pathlib import Path

import click

from harness.analysis.noise import unit_summary
from harness.bench import noise
from harness.bench.estimate import Weights, remaining_s, units_s
from harness.bench.planned import budget_record, covers_line, dry_run as print_dry_run, estimate_line, \
    fit_new_run, plan_line
from harness.bench.probe import Figures
from harness.bench.prepare import check_out, models_info, preflight, prepare_calibrations, same_models, same_prompts
from harness.bench.rounds import next_round, open_categories
from harness.bench.confirm import server_check
from harness.bench.units import Unit, retime_busy, retime_busy_replays, run_replays, run_units
from harness.errors import HarnessError
from harness.instance import Instance
from harness.plan import Params, expand, first_round, prompt_pool
from harness.report import write_reports
from harness.report.sections import budget_line
from harness.report.tables import compute
from harness.rundir import (DRIFT_DIR, FIDELITY_FILE, RUN_SCHEMA, RUNS_DIR, cache_dir, discard_run_dir, drop_unreadable,
                            finished, lock_run, new_run_dir, noise_records, plan_rounds, read_plan, record_noise,
                            record_result, repair_results, traces_missing, unit_id, write_plan)


def run_bench(params: Params, prompts: list, out_root: Path, resume: Path | None, skip_unsupported: bool,
              command: str, allow_busy: bool = False, rerun_busy: bool = False, dry_run: bool = False) -> Path | None:
    """The run directory, once the run is done; None for a dry run (the plan printed, nothing run)."""
    from harness.procs import stop_on_signals
    check_out(out_root, resume)
    locks: list[int] = []  # the run directory's lock, held for the whole invocation
    try:
        with stop_on_signals():  # SIGTERM, SIGHUP: stop like a Ctrl-C
            return _run_bench(params, prompts, out_root, resume, skip_unsupported, command, allow_busy,
                              rerun_busy, locks, dry_run)
    finally:
        for fd in locks:
            os.close(fd)


def _run_bench(params: Params, prompts: list, out_root: Path, resume: Path | None, skip_unsupported: bool,
               command: str, allow_busy: bool, rerun_busy: bool, locks: list[int], dry_run: bool) -> Path | None:
    started = time.monotonic()
    if resume:
        read_plan(resume)  # a directory that is not a run says so before anything is written in it
        locks.append(lock_run(resume))
        plan = read_plan(resume)  # read again under the lock: another process may have just finished with it
        run_dir = resume
        repair_results(run_dir)
        drop_unreadable(run_dir / "results.jsonl")  # a row cut short mid-file: its unit runs again
        instances = [Instance.from_dict(d) for d in plan["instances"]]
        params = Params.from_dict(plan["params"])
        pool = prompt_pool(params, plan["categories"])
        rounds = plan_rounds(plan)
        same_models(plan)
        same_prompts(plan, pool)
    else:
        instances = expand(params)
        pool = prompt_pool(params) if params.until_confident else prompts
        rounds = [[p.id for p in prompts]]
    by_id = {p.id: p for p in pool}
    gone = [i for r in rounds for i in r if i not in by_id]
    if gone:
        raise HarnessError(f"the run's prompts {', '.join(gone[:3])} are no longer in its prompt files; restore them "
                           "to resume it")
    first = [by_id[i] for i in rounds[0]]
    skipped = preflight(instances, first, skip_unsupported, params.max_tokens, params.n_ctx, params.engine)
    if params.engine == "server":  # no llama-server to run: one line before any run directory is made
        from harness.bench.serverunit import same_server, server_binary, server_offload
        binary, version = server_binary(params)
        skipped |= server_offload(instances, binary, skip_unsupported)
        if resume:
            same_server(resume, binary, version)
    idle = noise.idle_check(params.busy_threshold, allow_busy)  # before anything is timed, calibration included
    figures = Figures()  # each model's probe, timed once, and the prompts' lengths: what the estimates start from
    if not resume:
        fitted = fit_new_run(params, skipped, figures)
        if fitted.cuts:  # the run as cut to fit its budget
            params, first = fitted.params, first_round(fitted.params)
            instances, pool = expand(params), prompt_pool(params) if params.until_confident else first
            by_id, rounds = {p.id: p for p in pool}, [[p.id for p in first]]
        if line := budget_line(fitted.record()):
            click.echo(line, err=True)
        if params.prompt_cache and any(i.parallel > 1 for i in instances):
            click.echo("prompt cache: for one request at a time only; with several, a prompt's evaluation stalls the "
                       "others' steps, which their throughput measures", err=True)
        if dry_run:
            print_dry_run(instances, skipped, first, params, fitted, figures)
            return None
        run_dir = new_run_dir(out_root / RUNS_DIR)
        locks.append(lock_run(run_dir))
        from harness import sysinfo
        plan = {"schema": RUN_SCHEMA, "command": command, "params": params.to_dict(),
                "instances": [i.to_dict() for i in instances], "prompt_ids": rounds[0],
                "prompt_digests": {p.id: p.digest for p in pool}, "rounds": rounds,
                "categories": sorted({p.category for p in first}),
                "pool_sizes": dict(Counter(p.category for p in pool)),  # the looks' spending runs to these
                "prompt_files": params.prompts, "system": sysinfo.collect(), "started": time.time(),
                "idle_check": idle,
                "models": models_info({str(i.draft) for i in instances if not i.baseline},
                                      targets={i.target for i in instances}),
                "budget": budget_record(fitted, skipped, figures)}
        write_plan(run_dir, plan)
    if resume:
        plan["idle_check"] = idle  # what the report says of the machine before this invocation's measurements
        write_plan(run_dir, plan)
    record_noise(run_dir, {"unit": "idle-check", **idle})
    if any(i.adaptive for i in instances) or params.calibrate:
        try:
            prepare_calibrations([i for i in instances if i.id not in skipped], run_dir, params.calibrate)
        except HarnessError:
            if not resume:
                discard_run_dir(run_dir)  # nothing ran: leave no empty run behind, nor `latest` pointing at it
            raise
    done = {u: r for u, r in finished(run_dir).items()  # a finished unit whose trace is gone runs again
            if not traces_missing(run_dir, r, params.paired)}
    if rerun_busy:  # measure again what ran while the machine was busy
        busy = {u for u, rec in noise_records(run_dir).items() if rec.get("config") and unit_summary(rec)["busy"]}
        done = {u: r for u, r in done.items() if u not in busy}
        click.echo(f"measuring {len(busy)} unit(s) again that ran on a busy machine", err=True)
    todo: list[Unit] = []
    for r, ids in enumerate(rounds):
        for i in instances:
            u = unit_id(i.id, r)
            if done.get(u, {}).get("status") in ("ok", "skipped"):
                continue
            if i.id in skipped:
                record_result(run_dir, {"config": i.id, "unit": u, "round": r, **i.to_dict(), "status": "skipped",
                                        "error": skipped[i.id]})
            elif params.timed_subset and not i.baseline:  # timed only if the replay chose it (on its prompts)
                if i.id in plan.get("timed", {}):
                    todo.append((i, r, [by_id[x] for x in plan["timed"][i.id]]))
            else:
                todo.append((i, r, [by_id[x] for x in ids]))
    click.echo(f"run directory: {run_dir}", err=True)
    click.echo(plan_line(instances, skipped, first, params, len(todo), not resume), err=True)
    click.echo(covers_line(instances, first, params), err=True)
    est = remaining_s(todo, instances, skipped, first, params, run_dir, plan, figures) if resume \
        else fitted.estimate_after_s
    calibrated = resume and (run_dir / "calibration").is_dir() and any((run_dir / "calibration").iterdir())
    click.echo(estimate_line(est, params, "the calibrations and probes" if calibrated else figures.source()), err=True)
    took: dict[str, float] = {}  # this invocation's seconds per part, as the estimate names its parts
    weights = Weights(params, figures)

    def part(name: str, work, *args) -> None:
        t0 = time.monotonic()
        try:
            work(*args)
        finally:
            took[name] = took.get(name, 0.0) + time.monotonic() - t0

    def left_s(after: str) -> float | None:
        """The budget's seconds beyond this invocation's time so far and its estimate of the parts after `after`."""
        if not params.budget_min:
            return None
        parts = list((plan.get("budget") or {}).get("parts_s") or {})
        rest = parts[parts.index(after) + 1:] if after in parts else []
        return params.budget_min * 60 - (time.monotonic() - started) - sum(plan["budget"]["parts_s"][k] for k in rest)
    def unit_took(inst: Instance, s: float) -> None:  # the plain baselines are the evidence, apart from the rest
        name = "evidence" if inst.baseline else "units"
        took[name] = took.get(name, 0.0) + s
    try:
        run_units(todo, params, run_dir, weights, took=unit_took)
        retime_busy(todo, params, run_dir, weights, lambda: left_s("units"), took=unit_took)
        if params.replay:
            part("replay", run_replays, instances, skipped, first, params, run_dir, weights)
            part("replay", retime_busy_replays, instances, skipped, first, params, run_dir, weights,
                 lambda: left_s("replay"))
        if params.timed_subset and "timed" not in plan:
            part("timed subset", _timed_subset, instances, skipped, first, params, run_dir, plan, by_id, weights,
                 lambda: left_s("timed subset"))
        if params.until_confident:
            part("rounds", _until_confident, instances, skipped, pool, rounds, params, run_dir, plan, figures, weights)
        if not params.timed_subset:  # the timed subset is paired; its baselines ran on every prompt
            part("drift check", _closing_baselines, instances, skipped, first, params, run_dir, weights)
        part("fidelity", _target_fidelity, params, first, run_dir)
        if params.server_check:  # the answers, now final, in llama-server
            # the last part: every worker start and load is paid by now, so only the reports come after it
            part("llama-server check", server_check, params, run_dir, plan,
                 lambda: left_s("worker starts and model loads"), figures)
    except KeyboardInterrupt as e:
        from harness.procs import Terminated
        if params.until_confident:
            plan["until_confident"] = plan.get("until_confident", {}) | {"stopped": "interrupted"}
        _record_took(run_dir, plan, took, started)
        n = sum(1 for r in finished(run_dir).values() if r.get("status") == "ok")
        write_reports(run_dir)
        how, code = (f"stopped by {e.name}", 128 + e.signum) if isinstance(e, Terminated) else ("interrupted", 130)
        raise HarnessError(f"{how}: {n} unit(s) finished and kept, and the prompts the stopped one finished; "
                           f"continue with `harness bench --resume {run_dir}`", exit_code=code) from None
    _record_took(run_dir, plan, took, started)
    md = write_reports(run_dir)
    click.echo(f"report: {md}", err=True)
    shutil.rmtree(cache_dir(run_dir), ignore_errors=True)  # up to ~1 GB; an interrupted run keeps it for --resume
    click.echo(f"estimated {est / 60:.1f} min, took {(time.monotonic() - started) / 60:.1f} min", err=True)
    _refuse_failed(run_dir, md)
    return run_dir


FAILED_UNITS_EXIT = 3  # the sweep went on past a failed unit: the report stands on the others (docs/usage.md)


def _refuse_failed(run_dir: Path, md: Path) -> None:
    """A run that measured nothing is no answer (exit 1), though its report (which says why each unit failed) is
    kept; one with a failed unit among measured ones ends with a line naming it and --resume (FAILED_UNITS_EXIT)."""
    rows = finished(run_dir).values()
    failed = [r for r in rows if r.get("status") == "error"]
    if not failed:
        return
    why = str(failed[0].get("error") or "no reason recorded").strip().splitlines()
    first = f"{failed[0].get('unit')}: {why[-1][:300] if why else ''}"
    again = f"`harness bench --resume {run_dir}` runs the failed ones again"
    if not any(r.get("status") == "ok" for r in rows):
        raise HarnessError(f"every unit of the run failed ({len(failed)}; the first, {first}): {md} says why for "
                           f"each; once mended, {again}")
    raise HarnessError(f"{len(failed)} unit(s) of the run failed (the first, {first}); the report {md} stands on "
                       f"the others; once mended, {again}", exit_code=FAILED_UNITS_EXIT)


def _timed_subset(instances: list[Instance], skipped: dict, first: list, params: Params, run_dir: Path, plan: dict,
                  by_id: dict, weights: Weights, left_s) -> None:
    """The configurations the replay's predictions chose (bench.subset), timed on each category's first prompts."""
    from harness.bench.subset import choose
    plan["timed"], plan["timed_in_sample"] = choose(run_dir, [i for i in instances if i.id not in skipped], first,
                                                    params.timed_subset, params.timed_scope)
    write_plan(run_dir, plan)
    click.echo(f"timed subset from the replay: {len(plan['timed'])} configuration(s)", err=True)
    units = [(i, 0, [by_id[x] for x in plan["timed"][i.id]]) for i in instances if i.id in plan["timed"]]
    run_units(units, params, run_dir, weights)
    retime_busy(units, params, run_dir, weights, left_s)


def _record_took(run_dir: Path, plan: dict, took: dict[str, float], started: float) -> None:
    """plan.json's `took_s`: the run's seconds per part and in all before its report, over every invocation (a
    resumed run adds to what the interrupted one spent): what the report sets beside the estimate."""
    total = plan.get("took_s", {})
    for k, s in took.items():
        total[k] = round(total.get(k, 0.0) + s, 1)
    total["total"] = round(total.get("total", 0.0) + time.monotonic() - started, 1)
    plan["took_s"] = total
    write_plan(run_dir, plan)


def _target_fidelity(params: Params, prompts: list, run_dir: Path) -> None:
    """With several targets, how far each drifts from the first (`harness fidelity` on one prompt per category):
    what the report's quantization table puts beside their speed. Nothing is timed here."""
    from harness.bench.subset import first_prompts
    from harness.fidelity import fidelity
    out = run_dir / FIDELITY_FILE
    if len(params.target) < 2 or out.exists():
        return
    click.echo(f"fidelity of {', '.join(params.target[1:])} against {params.target[0]}", err=True)
    try:
        rows = fidelity(params.target[0], params.target[1:], [p for ps in first_prompts(prompts, 1).values()
                                                             for p in ps], params.max_tokens or 32, n_ctx=params.n_ctx)
    except HarnessError as e:  # targets of different tokenizers have no fidelity to each other; the sweep stands
        click.echo(f"no fidelity figures: {e}", err=True)
        rows = []
    out.write_text(json.dumps(rows, indent=1))


def spent_s(run_dir: Path) -> float:
    """Worker time the run has spent so far (what --budget-min bounds)."""
    return sum(r.get("wall_s") or 0.0 for r in finished(run_dir).values())


def _until_confident(instances: list[Instance], skipped: dict, pool: list, rounds: list[list[str]], params: Params,
                     run_dir: Path, plan: dict, figures: Figures, weights: Weights) -> None:
    """Rounds of one more prompt per category whose verdict is open, until all settle, the budget is spent, or
    those categories have no prompts left; the plan records each round before it runs and the outcome after."""
    used = {i for r in rounds for i in r}
    uc = plan.get("until_confident") or {}
    exhausted: set[str] = set(uc.get("exhausted", []))
    history = uc.get("history", [])
    while True:
        v = compute(run_dir).get("verdicts")
        open_ = open_categories(v)
        now = [] if v is None else [[r["category"], r["policy"], r["verdict"]] for r in v.iter_rows(named=True)]
        history = [h for h in history if h["round"] < len(rounds) - 1] + [
            {"round": len(rounds) - 1, "spent_s": round(spent_s(run_dir), 1), "verdicts": now}]
        add, out = next_round(open_, pool, used)
        exhausted |= set(out)
        if not open_:
            stopped = "settled"
            break
        if not add:
            stopped = "prompts"
            break
        r = len(rounds)
        units = [(i, r, add) for i in instances if i.id not in skipped]
        est = units_s(units, params, run_dir, figures)
        if params.budget_min and spent_s(run_dir) + est > params.budget_min * 60:
            stopped = "budget"
            break
        click.echo(f"round {r}: verdicts open in {', '.join(open_)}; adding {', '.join(p.id for p in add)} "
                   f"(about {est / 60:.1f} min)", err=True)
        rounds.append([p.id for p in add])
        used |= set(rounds[-1])
        plan |= {"rounds": rounds, "until_confident": {"budget_min": params.budget_min, "stopped": None,
                                                        "exhausted": sorted(exhausted), "history": history}}
        write_plan(run_dir, plan)
        run_units(units, params, run_dir, weights)
        retime_busy(units, params, run_dir, weights,
                    lambda: params.budget_min * 60 - spent_s(run_dir) if params.budget_min else None)
    plan |= {"rounds": rounds, "until_confident": {"budget_min": params.budget_min, "stopped": stopped,
                                                    "exhausted": sorted(exhausted), "history": history}}
    write_plan(run_dir, plan)
    click.echo(f"--until-confident: {stopped} after {len(rounds)} round(s)", err=True)


def _closing_baselines(instances: list[Instance], skipped: dict, prompts: list, params: Params, run_dir: Path,
                       weights: Weights) -> None:
    """The plain baselines once more, after everything else, on the first round's prompts: how far the machine's
    speed drifted while the sweep ran. Kept apart in run_dir/drift."""
    base = [i for i in instances if i.baseline and i.id not in skipped]
    if not base or len(base) == len(instances):
        return
    ran = finished(run_dir)  # a baseline that failed in the sweep (a prompt too long, say) would fail again
    base = [i for i in base if ran.get(i.id, {}).get("status") == "ok"]
    if not base:
        return
    d = run_dir / DRIFT_DIR
    (d / "traces").mkdir(parents=True, exist_ok=True)
    done = finished(d)
    todo = [(i, 0, prompts) for i in base if done.get(i.id, {}).get("status") != "ok"]
    if todo:
        click.echo("drift check: the plain baselines again", err=True)
        run_units(todo, params, d, weights, noise_to=run_dir)


def command_line(argv: list[str]) -> str:
    return "harness " + " ".join(shlex.quote(a) for a in argv)
