"""Running the work of a sweep: each unit (a configuration over a round of prompts) and each baseline's replay
in a worker of its own, the machine's foreign load sampled while it runs, progress shown per prompt."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from harness.analysis.noise import SLOWED, WINDOW_S, unit_summary
from harness.bench import noise
from harness.bench.estimate import Weights
from harness.instance import Instance
from harness.plan import Params
from harness.rundir import finished, record_noise, unit_id

Unit = tuple[Instance, int, list]  # a configuration, a round, its prompts


def asked_share(inst: Instance, server: bool = False) -> float | None:
    """The share of the machine's cores a unit's worker asks for; None with offload, where the GPU works while
    the CPU waits, and in llama-server (server), whose model loads between requests use fewer cores."""
    import psutil

    from harness.engine import EngineConfig
    if inst.ngl or inst.ngl_draft or server:
        return None
    return min(1.0, EngineConfig(threads=inst.threads).resolved_threads() / (psutil.cpu_count() or 1))


def run_units(units: list[Unit], params: Params, run_dir: Path, weights: Weights, noise_to: Path | None = None,
              took: Callable[[Instance, float], None] | None = None) -> None:
    """Each unit in its own worker, the machine's foreign load sampled while it runs (into noise.jsonl); took, if
    given, is told each unit's configuration and seconds once it ends (or is interrupted)."""
    import time

    from harness.bench.prepare import same_sizes
    from harness.bench.progress import Progress, timed_watch
    from harness.bench.serverunit import run_server_unit
    from harness.bench.worker import run_in_worker
    from harness.rundir import read_plan
    home = noise_to or run_dir  # the drift check's directory holds no plan
    plan = read_plan(home)
    for k, (inst, r, prompts) in enumerate(units, 1):
        same_sizes(plan, home)
        what = ("baseline" if inst.baseline else f"{inst.draft_label} gamma={inst.gamma_label}") + (
            f" ({inst.setup})" if inst.setup else "")
        title = f"[{k}/{len(units)}] round {r}: {inst.target} {what} {inst.policy.label}"
        watch = timed_watch(run_dir, unit_id(inst.id, r), params.paired and not inst.baseline)
        t0 = time.monotonic()
        try:
            with noise.Sampler(params.busy_threshold, asked_share(inst, params.engine == "server")) as sampler, \
                    Progress(title, len(prompts) * params.repeat, watch, weights=weights.unit(inst, prompts)):
                res = run_in_worker(inst, r, prompts, params, run_dir, on_start=sampler.meter.watch) \
                    if params.engine != "server" else run_server_unit(inst, r, prompts, params, run_dir,
                                                                      on_start=sampler.meter.watch)
        finally:
            if took:
                took(inst, time.monotonic() - t0)
        rec = sampler.summary()
        label = f"drift/{inst.id}" if noise_to else unit_id(inst.id, r)  # the drift check feeds no verdict
        record_noise(noise_to or run_dir, {"unit": label, "config": None if noise_to else inst.id, "round": r} | rec)
        nz = unit_summary(rec)
        status = res["status"] + (f" ({res.get('error')})" if res["status"] != "ok" else "")
        busy = (f"; SLOWED: the worker got {nz['own_mean']:.0%} of the cores, less than {SLOWED:.0%} of what "
                f"its threads ask for" if nz["slowed"] else
                f"; BUSY: other processes used {nz['foreign_max']:.0%} of the cores over {WINDOW_S} s") \
            if nz["busy"] else ""
        click.echo(f"{title}: {status}{busy}", err=True)


def retime_busy(units: list[Unit], params: Params, run_dir: Path, weights: Weights,
                left_s: Callable[[], float | None], took: Callable[[Instance, float], None] | None = None) -> None:
    """The units of a pass that ran busy, measured once more at its end (a spell of foreign load passes; the new
    rows replace the old), where that fits in the budget: left_s(), the seconds it leaves beyond the rest of the
    run's estimate (None: no budget). A unit busy again, or not measured again, stays marked, and no verdict
    rests on it. took: as run_units'."""
    ids = noise.busy_units(run_dir, [unit_id(i.id, r) for i, r, _ in units])
    if ids and _fits(ids, finished(run_dir), left_s(), run_dir):
        run_units([x for x in units if unit_id(x[0].id, x[1]) in ids], params, run_dir, weights, took=took)


def retime_busy_replays(instances: list[Instance], skipped: dict, prompts: list, params: Params, run_dir: Path,
                        weights: Weights, left_s: Callable[[], float | None]) -> None:
    """retime_busy for the replays: a busy one's decode costs, which its predictions use, measured once more."""
    from harness.rundir import REPLAY_DIR
    ids = noise.busy_units(run_dir, [f"replay/{i.id}" for i in instances if i.baseline])
    done = {f"replay/{u}": r for u, r in finished(run_dir / REPLAY_DIR).items()}
    if ids and _fits(ids, done, left_s(), run_dir):
        run_replays(instances, skipped, prompts, params, run_dir, weights, again={u.removeprefix("replay/")
                                                                                 for u in ids})


def _fits(ids: list[str], done: dict[str, dict], left_s: float | None, run_dir: Path) -> bool:
    """Whether measuring these busy units again fits in the budget, as long as each took; says which way."""
    cost = sum(done.get(u, {}).get("wall_s") or 0.0 for u in ids)
    if left_s is not None and cost > left_s:
        click.echo(f"{len(ids)} unit(s) ran on a busy machine ({', '.join(ids)}); measuring them again (about "
                   f"{cost / 60:.1f} min) would pass the budget: no verdict rests on them (`harness bench --resume "
                   f"{run_dir} --rerun-busy` measures them again)", err=True)
        return False
    click.echo(f"measuring {len(ids)} unit(s) again that ran on a busy machine: {', '.join(ids)}", err=True)
    return True


def run_replays(instances: list[Instance], skipped: dict, prompts: list, params: Params, run_dir: Path,
                weights: Weights, again: set[str] = frozenset()) -> None:
    """Each finished plain baseline's outputs replayed through every model draft (and the n-gram proposers),
    watched for noise like any unit: the replay measures the decode costs its predictions use. again: baselines
    whose finished replay runs once more."""
    from harness.bench.progress import Progress, replay_watch
    from harness.bench.replay import per_prompt, proposers, run_replay
    from harness.rundir import REPLAY_DIR
    done, base_done = finished(run_dir / REPLAY_DIR), finished(run_dir)
    todo = [i for i in instances if i.baseline and i.id not in skipped
            and base_done.get(i.id, {}).get("status") == "ok"
            and (done.get(i.id, {}).get("status") != "ok" or i.id in again)]
    for k, base in enumerate(todo, 1):
        title = f"[replay {k}/{len(todo)}] {base.target} {base.policy.label}"
        drafts = proposers(instances, params, base)
        watch = replay_watch(run_dir, base.id, len(per_prompt(drafts, base.policy.greedy)))
        with noise.Sampler(params.busy_threshold, asked_share(base)) as sampler, \
                Progress(title, len(prompts), watch, weights=weights.replay(base, prompts, drafts)):
            res = run_replay(base, 0, prompts, drafts, params.replay_gamma, params, run_dir,
                             on_start=sampler.meter.watch)
        rec = sampler.summary()
        record_noise(run_dir, {"unit": f"replay/{base.id}", "config": None, "round": 0} | rec)
        status = res["status"] + (f" ({res.get('error')})" if res["status"] != "ok" else "")
        click.echo(f"{title}: {', '.join(map(str, drafts))} up to gamma {params.replay_gamma}: {status}", err=True)
