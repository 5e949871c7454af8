"""`harness bench --engine server`: one unit of the sweep (a configuration over a round of prompts) measured in
llama-server instead of the harness's own loop, written as the same traces, so that the report's intervals,
verdicts and output checks come out of the same analysis.

- The flags are those the report's "how to run it" gives (howto: llama.cpp's names for every type and
  setting); the plain reference is the same command with its --spec-* flags dropped and `--spec-type none`.
- A baseline configuration runs on one server, started for the unit and stopped after it. A speculative one runs
  as `harness server-check` does (crosscheck.servercheck.measure): every request and its plain twin each on a
  server started for it, one server at a time, the twin first on every second prompt (ABBA), so drift favours
  neither and no server is ever warm with an earlier prompt. Requests send `cache_prompt: false`, `-np 1`,
  n_predict = the max tokens, the policy's sampling (temperature 0 when greedy) and a seed per repeat.
- Per request the trace keeps the server's own figures (predicted_n, predicted_ms, prompt_n, prompt_ms, draft_n,
  draft_n_accepted, the output token ids, and its log's mean acceptance length) as a generation record and one
  step record holding the request's totals (`server_totals`): the server reports no steps, so figures per step
  (mean accepted length, alpha, per-position acceptance) are left unknown by the report. Speeds count as
  llama-server's predicted_per_second does: predicted_n - 1 tokens over predicted_ms (the first token comes from
  the prompt's logits, timed in prompt_ms).
- Greedy speculative outputs are compared token for token with their plain twins'; once the unit's servers have
  stopped, each divergence is classified on the target loaded here (divergence.unknown_blocks_check: the server
  does not say which verification block held the position, so every block it could have run in is tried; where
  no evaluation here chooses the speculative token, the server's own kernels decided it: unchecked).
- Anything that stops the unit (a flag this binary lacks, a server that exits at start, dies, never answers or
  answers without timings) is one line in the unit's error row; the sweep goes on with the next unit."""
from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from pathlib import Path

from harness.bench.partial import resume, timed_done
from harness.crosscheck import binary as binary_mod
from harness.crosscheck.checks import model_file, server_args, tokenize
from harness.crosscheck.run import require_plain
from harness.crosscheck.server import Server, free_port
from harness.crosscheck.servercheck import Command, body, measure
from harness.divergence import first_divergence
from harness.errors import HarnessError
from harness.instance import Instance
from harness.plan import Params
from harness.rundir import PAIRED_DIR, finished, trace_path, unit_id

ROLES = {"speculative": "speculative", "plain": "plain"}
LOGS_DIR = "server_logs"


def command(inst: Instance, params: Params) -> Command:
    """The configuration's llama-server flags (howto's) and the plain twin's, as server-check runs them."""
    from harness.howto import howto
    spec, plain = server_args(howto(inst, params.n_ctx).server)
    plain = [*plain, "--spec-type", "none"]
    pol = inst.policy
    return Command(None, plain if inst.baseline else spec, plain, target=inst.target,
                   temp=None if pol.greedy else f"{pol.temperature:g}")


def run_server_unit(inst: Instance, round_: int, prompts: list, params: Params, run_dir: Path,
                    on_start=None) -> dict:
    """Measure the unit in llama-server and record its result row (ok, or the one line that stopped it)."""
    from harness.bench.worker import record_attempt
    attempt = os.urandom(6).hex()
    record_attempt(attempt, inst, round_, run_dir, lambda: _measure(inst, round_, prompts, params, run_dir, on_start),
                   engine="server")
    return finished(run_dir)[unit_id(inst.id, round_)]


def server_binary(params: Params) -> tuple[Path, str]:
    """The llama-server the run measures in and its version line; one line where there is none."""
    binary = binary_mod.find(params.llama_server or None)
    return binary, binary_mod.version(binary)


def server_offload(instances: list[Instance], binary: Path, skip_unsupported: bool) -> dict[str, str]:
    """--ngl above 0 asks llama-server's own build for GPU offload (the wheel's does not matter here): refused, or
    skipped with --skip-unsupported, where the binary lists no GPU device."""
    gpu = [i for i in instances if i.ngl > 0 or i.ngl_draft > 0]
    if not gpu or binary_mod.devices(binary):
        return {}
    if not skip_unsupported:
        raise HarnessError(f"--ngl/--ngl-draft above 0 asks llama-server for GPU offload, but {binary} lists no GPU "
                           "device (--list-devices): give --llama-server one built with GPU support (make native "
                           'CMAKE_ARGS="-DGGML_CUDA=on"), or pass --skip-unsupported to record those configurations '
                           "as skipped")
    return {i.id: "GPU offload requested but this llama-server has none" for i in gpu}


def same_server(run_dir: Path, binary: Path, version: str) -> None:
    """Refuse to resume a run whose finished units were measured in another llama-server version: one run would
    mix two servers' speeds under one engine."""
    was = sorted({r["llama_server_version"] for r in finished(run_dir).values()
                  if r.get("status") == "ok" and r.get("llama_server_version")} - {version})
    if was:
        raise HarnessError(f"this run was measured in llama-server {was[0].removeprefix('version: ')}, and {binary} "
                           f"is {version.removeprefix('version: ')}: restore that llama-server (its path, or `make "
                           "native`'s build) to resume the run, or start a new run")


def _measure(inst: Instance, round_: int, prompts: list, params: Params, run_dir: Path, on_start) -> dict:
    from harness.loop import check_fits
    from harness.trace import TraceWriter, discard
    t0 = time.perf_counter()
    binary, version = server_binary(params)
    c = command(inst, params)
    missing = binary_mod.lacking(c.spec + c.plain, binary_mod.known_flags(binary))
    if missing:
        raise HarnessError(f"{binary} has no {', '.join(dict.fromkeys(missing))} (its --help does not list it): "
                           "give --llama-server a newer llama-server, or leave this configuration out")
    unit = unit_id(inst.id, round_)
    toks = {pid: (t, mt) for pid, t, mt in tokenize(model_file(inst.target), prompts, params.max_tokens)}
    for t, mt in toks.values():
        check_fits(len(t), mt, inst.draft.longest(inst.gamma), params.n_ctx)
    requests = [(pr, rep) for rep in range(params.repeat) for pr in prompts]
    modes = {"baseline": trace_path(run_dir, unit)} if inst.baseline else {
        "speculative": trace_path(run_dir, unit), "baseline": trace_path(run_dir / PAIRED_DIR, unit)}
    # an interrupted unit goes on from its finished prompts (each twin beside its request, in the ABBA order as
    # though none had been kept); a diverged one without its divergence record runs again
    check = inst.policy.greedy and not inst.baseline
    keep = resume(modes, run_dir, unit, lambda got: timed_done(got, check, {}))
    skip = {k for k, (pr, rep) in enumerate(requests) if (pr.id, rep) in keep}
    traces = {}
    for mode, f in modes.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        if not keep:
            discard(f)  # a rerun replaces a partial trace
        traces[mode] = TraceWriter(f, config=inst.id, mode=mode)
    log_dir = run_dir / LOGS_DIR / unit
    seeds = [{} if inst.policy.greedy else {"seed": inst.policy.seed + rep} for _, rep in requests]
    done = iter([(k, r) for k, r in enumerate(requests) if k not in skip])

    def write(rec: dict) -> None:
        k, (pr, rep) = next(done)
        if "plain" in rec:
            require_plain(rec["plain"], pr.id)
        if "speculative" in rec:  # its server served this request alone: its log's acceptance line is the request's
            rec["speculative"] |= logged(log_dir / f"{k + 1:02d}-{pr.id}-speculative.log")
        for role, mode in (("speculative", "speculative"), ("plain", "baseline")):
            if role in rec and mode in traces:
                for r in records(rec[role], pr, rep, mode):
                    traces[mode].write(r)
        if inst.policy.greedy and "speculative" in rec:
            pair = (rec["speculative"]["tokens"] or [], rec["plain"]["tokens"] or [])
            if first_divergence(*pair) is not None:
                diverged.append((pr.id, rep, toks[pr.id][0], *pair))
    diverged: list = []  # classified once every server has stopped, so that no check runs beside one
    try:
        listed = [(pr.id, *toks[pr.id]) for pr, _ in requests]
        if inst.baseline:
            plain_unit(binary, c, listed, log_dir / "plain.log", seeds, on_start, write, params, skip)
        else:
            measure(binary, c, listed, log_dir, params.start_timeout, params.request_timeout, seeds, on_start, write,
                    ROLES, skip)
        for r in classified(inst, params, diverged):
            traces["speculative"].write(r)
    finally:
        for tw in traces.values():
            tw.close()
    draft = inst.draft.model
    # the KV cache is the server's, unknown here; peak_rss_bytes (record_attempt's) is the harness's process
    return {"status": "ok", "wall_s": time.perf_counter() - t0, "llama_server": str(binary),
            "llama_server_version": version, "server_command": c.spec, "plain_command": c.plain, "kv_bytes": None,
            "target_bytes": model_file(inst.target).stat().st_size,
            "draft_bytes": model_file(draft).stat().st_size if draft else 0}


def classified(inst: Instance, params: Params, diverged: list) -> list[dict]:
    """Each greedy divergence (prompt id, repeat, prompt tokens, speculative and plain output), classified by
    re-evaluating the target here (divergence.unknown_blocks_check: llama-server reports no blocks)."""
    if not diverged:
        return []
    from harness.divergence import unknown_blocks_check
    from harness.engine import Engine
    from harness.llamacpp import gpu_offload_supported
    cfg = inst.engine_config(params.n_ctx)
    if not gpu_offload_supported():  # llama-server did the offload: a wheel without it evaluates on the CPU
        cfg = replace(cfg, n_gpu_layers=0)
    target = Engine(model_file(inst.target), cfg)
    try:
        return [{"type": "divergence", "prompt_id": pid, "repeat": rep,
                 **unknown_blocks_check(target, prompt, spec, plain, inst.draft.longest(inst.gamma))}
                for pid, rep, prompt, spec, plain in diverged]
    finally:
        target.close()


def plain_unit(binary: Path, c: Command, listed: list, log: Path, seeds: list[dict], on_start, write,
               params: Params, skip: set[int]) -> None:
    """A baseline configuration: every request (but those in skip, kept from an interrupted attempt) on one plain
    server, started for the unit."""
    from harness.crosscheck.run import ask
    if len(skip) == len(listed):
        return
    srv = Server(binary, c.plain, free_port(), log, ROLES["plain"], on_spawn=on_start)
    try:
        srv.start(params.start_timeout)
        for k, ((pid, tokens, mt), extra) in enumerate(zip(listed, seeds)):
            if k not in skip:
                write({"id": pid, "plain": ask(srv, pid, body(tokens, mt, c) | extra, params.request_timeout)})
    finally:
        srv.stop()


LOGGED = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([\d.]+)")


def logged(log: Path) -> dict:
    """What llama-server's log says of its one request's drafts (print_timing, at its default verbosity): accepted,
    drafted and its mean acceptance length (1 + accepted per verification step, to 2 decimals); {} where it says
    nothing (nothing drafted)."""
    try:
        found = LOGGED.findall(log.read_text(errors="replace"))
    except OSError:
        return {}
    if len(found) != 1:
        return {}
    a, g, mean = found[0]
    return {"log_accepted": int(a), "log_drafted": int(g), "log_mean_len": float(mean)}


def records(r: dict, pr, rep: int, mode: str) -> list[dict]:
    """One request's trace records: its totals as one step (what the analysis sums acceptance and time over), then
    its generation with the server's own figures."""
    n, ms = r["predicted_n"], r["predicted_ms"]
    decoded = max(n - 1, 0)  # the first token is the prompt's, in prompt_ms
    common = {"category": pr.category, "prompt_id": pr.id, "repeat": rep}
    step = common | {"type": "step", "step": 0, "server_totals": True, "proposed": r["draft_n"] or 0,
                     "accepted": r["draft_n_accepted"] or 0, "emitted": decoded, "rejected_at": None,
                     "alpha": [], "target_conf": [], "draft_ms": 0.0, "verify_ms": ms, "overhead_ms": 0.0}
    prompt_ms = r.get("prompt_ms")
    gen = common | {"type": "generation", "mode": mode, "prompt_tokens": r.get("prompt_n"), "n_tokens": decoded,
                    "output_tokens": n, "tokens": r["tokens"], "stop": r.get("stop_type"), "steps": 1,
                    "prompt_cached": False, "prompt_eval_ms": prompt_ms, "draft_prefill_ms": 0.0, "gen_ms": ms,
                    "latency_ms": None if prompt_ms is None else prompt_ms + ms,
                    "tokens_per_s": decoded / ms * 1e3 if ms > 0 else 0.0,
                    "server": {k: r.get(k) for k in ("predicted_n", "predicted_ms", "prompt_n", "prompt_ms",
                                                     "draft_n", "draft_n_accepted", "log_accepted", "log_drafted",
                                                     "log_mean_len") if k in r}}
    return [step, gen]
