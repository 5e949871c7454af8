"""The answer in llama-server (`--server-check N`, `make bench`'s default): once the harness has measured and
predicted, each answer's configuration runs in llama.cpp's own llama-server with its own type and flags (the
command the report gives), speculative and plain, on the category's first N prompts. This is `harness crosscheck`'s
measurement, inside the run and its budget: one server at a time, the speculative one first for every second
configuration (drift favours neither), no prompt cache, the harness's token ids. Answers that say "speculate" go
first, then the others by their predicted speedup, while the budget lasts; the report says what was not measured,
and why. Without a llama-server (`make native`) the check does not run, and the report says so."""
from __future__ import annotations

from pathlib import Path

import click

from harness.analysis.predict import ALL
from harness.analysis.verdict import SPECULATE
from harness.errors import HarnessError
from harness.plan import Params


def server_check(params: Params, run_dir: Path, plan: dict, time_left=None, figures=None) -> None:
    """Measure the run's answers in llama-server (crosscheck.json and .md in the run directory); where it cannot
    run, one line on stderr and in plan.json's `server_check`, which the report shows. figures: the run's probes
    (bench.probe.Figures), which price each check so that one the budget cannot hold is passed over for the next
    (estimate.check_ms)."""
    from harness.crosscheck import binary as binary_mod
    from harness.crosscheck.checks import checks
    from harness.crosscheck.run import kept_rows, measure_checks
    from harness.rundir import write_plan
    try:
        binary = binary_mod.find(params.llama_server or None)
        version = binary_mod.version(binary)
        found, _ = checks(run_dir, "all", params.server_check)
    except HarnessError as e:
        click.echo(f"llama-server check: not run: {e}", err=True)
        plan["server_check"] = {"not_run": str(e)}
        write_plan(run_dir, plan)
        return
    # the bottom lines first (each target's configuration over every category), then the answers per category
    found.sort(key=lambda c: (c.answer["category"] != ALL, c.answer["verdict"] != SPECULATE,
                              -(c.answer.get("speedup") or 0.0)))
    click.echo(f"llama-server check: {sum(not c.skip for c in found)} configuration(s), {params.server_check} "
               f"prompt(s) each, in {binary}", err=True)
    measure_checks(run_dir, found, kept_rows(run_dir), binary, version, None, params.start_timeout,
                   params.request_timeout, keep_going=True, time_left=time_left,
                   cost=None if figures is None else _cost(params, figures))


def _cost(params: Params, figures):
    """A check's estimated seconds, from the run's probes."""
    from harness.bench.estimate import check_ms
    return lambda c: check_ms(c.inst, [(len(t), mt) for _, t, mt in c.prompts], params, figures) / 1000
