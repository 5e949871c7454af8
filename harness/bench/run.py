"""`harness bench`: check everything up front, then run each configuration in a worker, then report."""
from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from harness.errors import HarnessError
from harness.plan import Instance, Params, expand
from harness.rundir import (DRIFT_DIR, RUNS_DIR, finished, new_run_dir, read_plan, record_result, repair_results,
                            write_plan)


def _preflight(instances: list[Instance], prompts: list, skip_unsupported: bool) -> dict[str, str]:
    """Refuse what cannot run before anything runs. Returns instance ids to record as skipped, with why."""
    from harness.align import require_aligned
    from harness.engine import GPU_BUILD_HINT, gpu_offload_supported
    from harness.models.catalog import load_catalog, require_present, resolve
    from harness.pair import parse_ngram
    from harness.proposers import NgramProposer

    cat = load_catalog()
    models = {i.target for i in instances} | {i.draft for i in instances if parse_ngram(i.draft) is None} - {"none"}
    for ref in sorted(models):
        m = resolve(ref, cat)
        require_present(m)
    for i in instances:
        n = parse_ngram(i.draft)
        if n is not None:
            NgramProposer(n)
    skipped = {}
    if not gpu_offload_supported():
        gpu = [i for i in instances if i.ngl > 0 or i.ngl_draft > 0]
        if gpu and not skip_unsupported:
            raise HarnessError(f"--ngl/--ngl-draft above 0 asks for GPU offload, but {GPU_BUILD_HINT} "
                               "(or pass --skip-unsupported to record those configurations as skipped)")
        skipped = {i.id: "GPU offload requested but this build has none" for i in gpu}
    checked = set()
    for i in instances:
        if i.baseline or parse_ngram(i.draft) is not None or (i.target, i.draft) in checked:
            continue
        require_aligned(resolve(i.target, cat).path, resolve(i.draft, cat).path, prompts)
        checked.add((i.target, i.draft))
    return skipped


def cost_needs(instances: list[Instance]) -> set[tuple[str, int, int]]:
    """(model, threads, ngl) triples whose decode costs the cost model needs."""
    from harness.engine import EngineConfig
    from harness.pair import parse_ngram
    out = set()
    for i in instances:
        if i.baseline:
            continue
        t = EngineConfig(threads=i.threads).resolved_threads()
        out.add((i.target, t, i.ngl))
        if parse_ngram(i.draft) is None:
            out.add((i.draft, t, i.ngl_draft))
    return out


def prepare_calibrations(instances: list[Instance], run_dir: Path, calibrate: bool) -> None:
    """Copy (or, with --calibrate, measure) every needed calibration into the run directory.
    Adaptive gamma cannot run without them."""
    import shutil

    from harness import calibrate as cal
    from harness.models.catalog import resolve
    needs = cost_needs(instances)
    adaptive = any(i.adaptive for i in instances)
    dest = run_dir / "calibration"
    dest.mkdir(exist_ok=True)
    for ref, threads, ngl in sorted(needs):
        name = resolve(ref).name
        if cal.cal_path(name, threads, ngl, dest).exists():
            continue  # a resumed run keeps the costs its finished configurations ran with
        src = cal.cal_path(name, threads, ngl)
        if calibrate:
            click.echo(f"calibrating {name} (threads {threads}, ngl {ngl})", err=True)
            src = cal.save(cal.calibrate(ref, threads, ngl))
        if src.exists():
            shutil.copy(src, cal.cal_path(name, threads, ngl, dest))
        elif adaptive:
            raise HarnessError(f"--gamma auto needs the decode costs of {name} (threads {threads}, ngl {ngl}): run "
                               f"`harness calibrate {name} --threads {threads} --ngl {ngl}` or add --calibrate")


def _probe_ms(ref: str) -> float:
    """A few single-token decodes of a model: the basis of the up-front estimate."""
    from harness.engine import Engine, EngineConfig
    from harness.models.catalog import resolve
    with Engine(resolve(ref).path, EngineConfig(n_ctx=64, n_batch=16)) as e:
        e.decode([1, 2], logits="last")
        t = time.perf_counter()
        for k in range(4):
            e.decode([3 + k], logits="last")
        return (time.perf_counter() - t) / 4 * 1000


def estimate_s(instances: list[Instance], prompts: list, max_tokens: int, repeat: int, paired: bool = False) -> float:
    """Crude: each generated token costs one target decode, a speculative one also ~gamma/2 draft decodes and
    a verify ~1.5x a decode; prompt evaluation ~1/8 of a decode per token; paired adds a plain run to each
    speculative one. Printed as an estimate only."""
    from harness.pair import parse_ngram
    ms = {}
    total = 0.0
    n_tok = sum(max_tokens or p.max_tokens for p in prompts) * repeat
    n_prompt = sum(len(p.text or " ".join(c for _, c in p.messages)) // 4 for p in prompts) * repeat
    for i in instances:
        t = ms.setdefault(i.target, _probe_ms(i.target))
        per_tok = t
        if not i.baseline:
            d = 0.0 if parse_ngram(i.draft) is not None else ms.setdefault(i.draft, _probe_ms(i.draft))
            per_tok = (i.gamma * d + 1.5 * t) / (1 + 0.5 * i.gamma) + (t if paired else 0)
        total += n_tok * per_tok + n_prompt * t / 8 * (1 if i.baseline else 1.3 + paired)
    return total / 1000


def run_bench(params: Params, prompts: list, out_root: Path, resume: Path | None, skip_unsupported: bool,
              command: str) -> Path:
    from harness.report import write_reports

    if resume:
        plan = read_plan(resume)
        run_dir = resume
        repair_results(run_dir)
        instances = [Instance(**d) for d in plan["instances"]]
        from harness.prompts import load
        prompts = load(paths=None, categories=plan["categories"]) if not plan.get("prompt_files") else \
            load(paths=[Path(p) for p in plan["prompt_files"]])
        prompts = [p for p in prompts if p.id in set(plan["prompt_ids"])]
        params = Params(**plan["params"])
    else:
        instances = expand(params)
    skipped = _preflight(instances, prompts, skip_unsupported)
    if not resume:
        run_dir = new_run_dir(out_root / RUNS_DIR)
        from harness import sysinfo
        write_plan(run_dir, {"command": command, "params": asdict(params), "instances": [asdict(i) for i in instances],
                             "prompt_ids": [p.id for p in prompts], "categories": sorted({p.category for p in prompts}),
                             "prompt_files": params.prompts, "system": sysinfo.collect(), "started": time.time(),
                             "models": models_info({i.target for i in instances} | {i.draft for i in instances})})
    if any(i.adaptive for i in instances) or params.calibrate:
        try:
            prepare_calibrations([i for i in instances if i.id not in skipped], run_dir, params.calibrate)
        except HarnessError:
            if not resume:
                import shutil
                shutil.rmtree(run_dir)  # nothing ran: leave no empty run behind
            raise
    done = finished(run_dir)
    todo = [i for i in instances if done.get(i.id, {}).get("status") not in ("ok", "skipped")]
    for i in todo:
        if i.id in skipped:
            record_result(run_dir, {"config": i.id, **asdict(i), "status": "skipped", "error": skipped[i.id]})
    todo = [i for i in todo if i.id not in skipped]
    click.echo(f"run directory: {run_dir}", err=True)
    click.echo(f"{len(instances)} configurations ({len(todo)} to run) x {len(prompts)} prompts x "
               f"{params.repeat} repeat(s)", err=True)
    if todo:
        est = estimate_s(todo, prompts, params.max_tokens, params.repeat, params.paired)
        click.echo(f"estimated time: about {est / 60:.1f} min (crude; from a 4-token probe of each model)", err=True)
    try:
        _run_all(todo, prompts, params, run_dir)
        _closing_baselines(instances, skipped, prompts, params, run_dir)
    except KeyboardInterrupt:
        n = sum(1 for r in finished(run_dir).values() if r.get("status") == "ok")
        write_reports(run_dir)
        raise HarnessError(f"interrupted: {n} of {len(instances)} configurations finished and kept; "
                           f"continue with `harness bench --resume {run_dir}`", exit_code=130) from None
    md = write_reports(run_dir)
    click.echo(f"report: {md}", err=True)
    return run_dir


def _run_all(todo: list[Instance], prompts: list, params: Params, run_dir: Path) -> None:
    from harness.bench.worker import run_in_worker
    tty = sys.stderr.isatty()
    bar = click.progressbar(todo, label="configurations", file=sys.stderr, show_eta=True,
                            item_show_func=lambda i: i and f"{i.draft} g{i.gamma_label}") if tty else None
    items = bar.__enter__() if bar else todo
    try:
        for k, inst in enumerate(items, 1):
            res = run_in_worker(inst, prompts, params.max_tokens, params.repeat, params.n_ctx, run_dir,
                                params.paired)
            if not tty:
                what = "baseline" if inst.baseline else f"{inst.draft} gamma={inst.gamma_label}"
                status = res["status"] + (f" ({res.get('error')})" if res["status"] != "ok" else "")
                click.echo(f"[{k}/{len(todo)}] {inst.target} {what} {json.dumps(inst.policy)}: {status}", err=True)
    finally:
        if bar:
            bar.__exit__(None, None, None)


def _closing_baselines(instances: list[Instance], skipped: dict, prompts: list, params: Params, run_dir: Path) -> None:
    """The plain baselines once more, after everything else: how far the machine's speed drifted while the
    sweep ran, which is the noise band of every speedup in the report. Kept apart in run_dir/drift."""
    from harness.bench.worker import run_in_worker
    base = [i for i in instances if i.baseline and i.id not in skipped]
    if not base or len(base) == len(instances):
        return
    d = run_dir / DRIFT_DIR
    (d / "traces").mkdir(parents=True, exist_ok=True)
    done = finished(d)
    for i in base:
        if done.get(i.id, {}).get("status") != "ok":
            click.echo(f"drift check: {i.target} baseline {json.dumps(i.policy)} again", err=True)
            run_in_worker(i, prompts, params.max_tokens, params.repeat, params.n_ctx, d)


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


def command_line() -> str:
    return "harness " + " ".join(shlex.quote(a) for a in sys.argv[1:])
