"""`harness crosscheck RUN_DIR` end to end: find llama-server, choose the configurations, run each one in two
servers one after the other (speculative, and plain as its baseline) over the run's prompts, pair them per prompt,
write each finished configuration at once, then the table."""
from __future__ import annotations

import math
import time
from pathlib import Path

import click

from harness.crosscheck import binary as binary_mod
from harness import checkrows
from harness.checkrows import UNMEASURED
from harness.report import llamaserver as output
from harness.crosscheck.checks import Check, checks
from harness.crosscheck.server import Server, free_port, require_free
from harness.analysis.serverstats import fault, figures, row_fault, same_outputs
from harness.errors import HarnessError



def payload(tokens: list[int], max_tokens: int, pol) -> dict:
    """/completion's body: the harness's own token ids (no BOS added to a token list), its max tokens and sampling
    policy, no prompt cache; generation stops at end of generation as the harness's does."""
    return {"prompt": tokens, "n_predict": max_tokens, "cache_prompt": False, "stream": False,
            "return_tokens": True, "temperature": pol.temperature, "top_k": pol.top_k, "top_p": pol.top_p,
            "min_p": pol.min_p, "seed": pol.seed}


def ask(srv: Server, pid: str, body: dict, timeout_s: float) -> dict:
    """One request; the server's own timings (and output token ids) of the response."""
    r = srv.complete(body, f"prompt {pid}", timeout_s)
    t = r.get("timings")
    if not isinstance(t, dict) or "predicted_n" not in t or "predicted_ms" not in t:
        raise HarnessError(f"llama-server ({srv.role}) answered prompt {pid} without timings.predicted_n and "
                           f"predicted_ms: is {srv.binary} llama.cpp's llama-server?")
    rec = {"predicted_n": t["predicted_n"], "predicted_ms": t["predicted_ms"], "prompt_n": t.get("prompt_n"),
           "prompt_ms": t.get("prompt_ms"), "draft_n": t.get("draft_n", 0),
           "draft_n_accepted": t.get("draft_n_accepted", 0), "stop_type": r.get("stop_type"),
           "tokens": r.get("tokens")}
    # the output's token ids are asked for (return_tokens): greedy outputs are compared on them
    why = fault(rec, body.get("n_predict")) or ("no tokens (the output's token ids)" if rec["tokens"] is None else None)
    if why:
        raise HarnessError(f"llama-server ({srv.role}) answered prompt {pid} with {why}: not a measurement, so "
                           f"nothing of it is stored; is {srv.binary} llama.cpp's llama-server?")
    return rec


def require_plain(rec: dict, pid: str) -> None:
    """A plain twin's response (--spec-type none) that reports drafts is no plain reference: refused in one line
    (server-check shows it instead, as its finding about the user's command)."""
    if rec.get("draft_n"):
        raise HarnessError(f"llama-server's plain twin (--spec-type none) drafted {rec['draft_n']} tokens on prompt "
                           f"{pid}: something outside its command (LLAMA_ARG_* environment variables?) turns "
                           "speculation on, so nothing is measured against plain decoding; unset it and run again")


def measure(binary: Path, c: Check, port: int, log_dir: Path, start_timeout: float, request_timeout: float,
            plain_first: bool) -> list[dict]:
    """Per prompt, the plain and the speculative server's timings: one server over every prompt, then the other
    (plain_first says which goes first; the caller alternates it from one configuration to the next). Never both
    up at once: on a CPU an idle llama-server's threads slow the busy one down several-fold. Each server is
    stopped whatever happens."""
    stem = f"{c.inst.id}-{c.answer['category']}"
    spec = Server(binary, c.spec_args, port, log_dir / f"{stem}-speculative.log", "speculative")
    plain = Server(binary, c.plain_args, port, log_dir / f"{stem}-plain.log", "plain")
    out = [{"id": i, "n_prompt": len(t), "max_tokens": mt} for i, t, mt in c.prompts]
    try:
        for srv in ((plain, spec) if plain_first else (spec, plain)):
            srv.start(start_timeout)
            for rec, (i, t, mt) in zip(out, c.prompts):
                rec[srv.role] = ask(srv, i, payload(t, mt, c.inst.policy), request_timeout)
                if srv is plain:
                    require_plain(rec["plain"], i)
            srv.stop()
    finally:
        spec.stop()
        plain.stop()
    return out


def base_row(c: Check) -> dict:
    a = c.answer
    keep = ("target", "ngl", "threads", "setup", "category", "policy", "verdict", "configuration", "source",
            "min_gain")
    return {k: a.get(k) for k in keep} | {"config": getattr(c.inst, "id", None), "harness": c.harness}


def kept_rows(run_dir: Path) -> list[dict]:
    """crosscheck.json's rows, less those holding a response that is not a measurement (stored before such were
    refused): each dropped with a line saying why, and measured again."""
    out = []
    for r in checkrows.load(run_dir):
        why = None if r.get("skip") else row_fault(r)
        if why:
            click.echo(f"crosscheck: {r.get('category')}, {r.get('policy')}: {r.get('configuration')}: the row in "
                       f"{checkrows.JSON} is not a measurement ({why}): dropped, measured again", err=True)
            continue
        out.append(r)
    return out


def measure_checks(run_dir: Path, found: list[Check], old: list[dict], binary: Path, version: str,
                   port: int | None, start_timeout: float, request_timeout: float, keep_going: bool = False,
                   time_left=None, cost=None) -> tuple[list[dict], int]:
    """Measure each check not already in `old` (crosscheck.json's rows), saving the file after each. keep_going:
    a check that fails is a row saying why and the next one runs (bench), else the error stops it all (with what
    finished kept). time_left(): seconds left to spend, or None; cost(check): its estimated seconds, scaled by
    what the checks measured so far took against their estimates. A check starts only where it fits (without
    cost, where the mean time of those measured so far does; the first where any time is left); one that does
    not is a row saying so, and the next, perhaps cheaper, is tried."""
    old = [r for r in old if not r.get("skip")]  # a row saying why one was not measured is made anew, or goes
    done = {r["key"]: r for r in old}
    rows: list[dict] = []
    measured, spent, ratios = 0, [], []
    for c in found:
        where = f"{c.answer['category']}, {c.answer['policy']}: {c.answer['configuration']}"
        if c.skip:
            rows.append(base_row(c) | {"key": f"skip-{c.answer['category']}-{c.answer['policy']}-"
                                              f"{getattr(c.inst, 'id', '')}", "skip": c.skip})
            continue
        if c.key in done:
            rows.append(done[c.key])
            click.echo(f"crosscheck: {where}: kept from {checkrows.JSON}", err=True)
            continue
        left = time_left() if time_left else None
        est = cost(c) if cost else None
        need = est * (sum(ratios) / len(ratios) if ratios else 1.0) if est else \
            (sum(spent) / len(spent) if spent else 0.0)
        if left is not None and left < need:
            rows.append(base_row(c) | {"key": f"later-{c.key}", "skip": UNMEASURED})
            continue
        click.echo(f"crosscheck: {where} ({c.answer['verdict']}), {len(c.prompts)} prompt(s), plain and "
                   "speculative", err=True)
        t0 = time.monotonic()
        try:
            prompts = measure(binary, c, port or free_port(), run_dir / checkrows.LOGS, start_timeout,
                              request_timeout, plain_first=measured % 2 == 0)
        except HarnessError as e:
            if not keep_going:
                kept = len([r for r in rows if not r.get("skip")])
                raise HarnessError(f"{e} ({kept} configuration(s) finished and kept in {run_dir / checkrows.JSON}: "
                                   "run crosscheck again to go on)", e.exit_code) from None
            click.echo(f"crosscheck: {where}: {e}", err=True)
            rows.append(base_row(c) | {"key": f"failed-{c.key}", "skip": f"failed: {e}"})
            continue
        finally:
            spent.append(time.monotonic() - t0)
            if est:
                ratios.append(spent[-1] / est)
        measured += 1
        rows.append(base_row(c) | {
            "key": c.key, "tool": version, "binary": str(binary), "speculative_command": c.spec_args,
            "plain_command": c.plain_args, "prompts": prompts,
            "llama": figures(prompts, c.answer["verdict"], c.answer["min_gain"])
            | {"same_output": list(same_outputs(prompts))}})
        checkrows.save(run_dir, checkrows.merge(old, rows))
        output.write_md(run_dir, rows)
    checkrows.save(run_dir, checkrows.merge(old, rows))
    return rows, measured


def crosscheck_command(run_dir: Path, llama_server: str | None = None, port: int | None = None,
                       only: str = "all", per_category: int = 0, start_timeout: float = 300.0,
                       request_timeout: float = 600.0, redo: bool = False) -> str:
    """Measure what is missing, write RUN_DIR/crosscheck.json and crosscheck.md, return the table to print."""
    from harness.procs import stop_on_signals
    if not run_dir.is_dir():
        raise HarnessError(f"{run_dir}: no such run directory")
    if per_category < 0:
        raise HarnessError(f"--per-category must be >= 0, got {per_category}")
    for name, v in (("--start-timeout", start_timeout), ("--request-timeout", request_timeout)):
        if not math.isfinite(v) or v <= 0:
            raise HarnessError(f"{name} must be a number of seconds above 0, got {v:g}")
    binary = binary_mod.find(llama_server)
    version = binary_mod.version(binary)
    if port is not None:
        require_free(port)
    from harness.rundir import read_plan
    if read_plan(run_dir).get("params", {}).get("engine") == "server":
        raise HarnessError(f"{run_dir} was measured in llama-server already (--engine server): crosscheck would "
                           "check llama-server against itself; crosscheck a run of the harness's own loop")
    found, _plan = checks(run_dir, only, per_category)
    old = [] if redo else kept_rows(run_dir)
    with stop_on_signals():
        rows, measured = measure_checks(run_dir, found, old, binary, version, port, start_timeout, request_timeout)
    md = output.write_md(run_dir, rows)
    from harness.report import write_reports
    write_reports(run_dir)  # the answer shows llama-server's figures beside its own
    return "\n".join([*output.summary(rows), f"{measured} configuration(s) measured now; written to {md} and "
                      f"{run_dir / checkrows.JSON}"])
