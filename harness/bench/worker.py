"""One unit of work (a configuration over a round of prompts) in its own process: clean RSS, and a crash in
llama.cpp ends only this worker."""
from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from dataclasses import replace
from pathlib import Path

from harness.errors import HarnessError
from harness.procs import UNWRITABLE_EXIT, death, peak_rss_bytes, rss_bytes_now, run_isolated
from harness.instance import Instance
from harness.plan import Params
from harness.rundir import PAIRED_DIR, cache_dir, finished, record_result, trace_file, trace_path, unit_id


def run_instance(inst: Instance, round_: int, prompts: list, params: Params, run_dir: Path) -> dict:
    """Every prompt (times params.repeat) through one configuration. params.paired: each speculative
    generation also runs as plain decoding in this worker, alternating which goes first, into run_dir/paired: a
    reference taken seconds apart, so the machine's drift over a long sweep cancels out of the speedup.
    params.prompt_cache: the models' prompts through the run's prompt cache (one request at a time only)."""
    from harness.bench.partial import UNIT, resume, timed_done
    from harness.loop import Request, check_fits
    from harness.pair import open_pair
    from harness.promptcache import PromptCache
    from harness.trace import TraceWriter, discard

    t0 = time.perf_counter()
    max_tokens, paired = params.max_tokens, params.paired
    unit = unit_id(inst.id, round_)
    before_models = rss_bytes_now()  # Python, numpy, llama.cpp's libraries: the process before any weights
    cache = PromptCache(cache_dir(run_dir)) if params.prompt_cache and inst.parallel == 1 else None
    pair = open_pair(inst.target, inst.draft, inst.engine_config(params.n_ctx),
                     inst.draft_engine_config(params.n_ctx),
                     check_alignment=False, drafting=inst.drafting,  # the sweep checked every pair up front
                     prompt_cache=cache)
    files = {"baseline" if inst.baseline else "speculative": trace_path(run_dir, unit)}
    if paired and not inst.baseline:
        files["baseline"] = trace_path(run_dir / PAIRED_DIR, unit)
    # greedy speculative outputs are checked against plain greedy decoding: the paired twin, or else the
    # baseline configuration's trace when it ran earlier in the sweep
    check = inst.policy.greedy and not inst.baseline
    plain_ref = plain_outputs(run_dir, inst, round_) if check and "baseline" not in files else {}
    # an interrupted unit goes on from its finished prompts; a batched one's requests share their batches and an
    # adaptive one's controller learns from prompt to prompt: those start afresh
    keep = resume(files, run_dir, unit, lambda traces: timed_done(traces, check, plain_ref)) \
        if inst.parallel == 1 and not inst.adaptive else set()
    for f in files.values():
        f.parent.mkdir(parents=True, exist_ok=True)
        if not keep:
            discard(f)  # a rerun replaces a partial trace (or an archived one)
    try:
        requests = []
        for pr in prompts:
            toks = pair.target.vocab.tokenize(pr.render(pair.target.vocab))
            mt = max_tokens or pr.max_tokens
            check_fits(len(toks), mt, inst.gamma, pair.target.n_ctx)
            requests.append((pr, Request(pr.id, toks, mt, pr.category)))
        warm_up(pair, requests[0][1].tokens, inst.parallel * (inst.gamma + 1) - 1)
        costs = not inst.baseline and round_ == 0  # the costs its rows pay, for the cost model

        def measure() -> None:
            tw = TraceWriter(files["speculative"], config=inst.id, mode="speculative")
            tw.write(measure_costs(pair, [r for _, r in requests], inst.gamma + 1, inst.parallel))
            tw.close()
        if costs and UNIT not in keep:
            measure()
        run_generations(inst, pair, requests, files, params.repeat, run_dir, check, plain_ref, keep)
        if costs:  # and again after the generations: calibrate.unit_costs pools the two, as the replay's are
            measure()
        kv = pair.target.kv_bytes() + (pair.draft_engine.kv_bytes() if pair.draft_engine else 0)
        engines = {"target": pair.target, "draft": pair.draft_engine}
        return {"status": "ok", "kv_bytes": kv, "rss_before_models": before_models,
                "kv_bytes_per_position": sum(e.kv_bytes() / e.n_ctx_alloc for e in engines.values() if e),
                "memory": [b | {"model": role} for role, e in engines.items() if e for b in e.memory],
                "flash_attn": {role: e.flash_attn for role, e in engines.items() if e},
                "target_bytes": pair.target.path.stat().st_size,
                "draft_bytes": pair.draft_engine.path.stat().st_size if pair.draft_engine else 0,
                "target_load_ms": pair.target.load_ms,
                "draft_load_ms": pair.draft_engine.load_ms if pair.draft_engine else 0.0,
                "wall_s": time.perf_counter() - t0} | ({"prompt_cache": cache.counts()} if cache else {})
    finally:
        pair.close()


def run_generations(inst: Instance, pair, requests: list, files: dict, repeat: int, run_dir: Path, check: bool,
                    plain_ref: dict, keep: set) -> None:
    """Through the loop in groups: one request at a time (but those in keep, finished before an interruption), or
    inst.parallel at a time over a category's requests (a batch holds one workload). With a paired twin, each
    group's plain run beside its speculative one, alternating which goes first, in the same order as though none
    had been kept."""
    from harness.loop import generate, generate_concurrent
    from harness.trace import TraceWriter
    pol, n, controllers = inst.policy, 0, {}
    if inst.parallel == 1:
        groups = [(pr.category, [req]) for pr, req in requests]
    else:
        by_cat: dict[str, list] = {}
        for pr, req in requests:
            by_cat.setdefault(pr.category, []).append(req)
        groups = list(by_cat.items())
    for rep in range(repeat):
        for cat, reqs in groups:
            one = reqs[0] if inst.parallel == 1 else None
            if one and (one.prompt_id, rep) in keep:
                n += 1
                continue
            reqs = [replace(r, repeat=rep) for r in reqs]  # their random streams (loop.streams)
            gamma = inst.gamma
            if inst.adaptive:  # one request at a time (plan.check_parallel)
                if cat not in controllers:
                    ctx = len(reqs[0].tokens) + reqs[0].max_tokens / 2
                    controllers[cat] = adaptive_controller(inst, pair, run_dir, ctx)
                gamma = controllers[cat]
            modes = list(files) if n % 2 == 0 else list(reversed(files))
            n += 1
            traces = {}
            for mode in modes:
                traces[mode] = tw = TraceWriter(files[mode], keep=check, config=inst.id, mode=mode, category=cat,
                                                repeat=rep, **({"prompt_id": one.prompt_id} if one else {}))
                prop, g = (pair.proposer, gamma) if mode == "speculative" else (None, 0)
                if one:
                    generate(pair.target, reqs[0], pol, prop, g, tw, mode, inst.verify, pair.prompt_cache)
                else:
                    generate_concurrent(pair.target, reqs, pol, inst.parallel, prop, g, tw, mode, inst.verify)
            if check:
                for req in reqs:
                    mine = {m: [r for r in t.records if r.get("prompt_id") == req.prompt_id] for m, t in traces.items()}
                    # the paired twin's steps say how many sequences shared each plain step; the baseline
                    # configuration's output alone is replayed one sequence at a time
                    plain = mine["baseline"][-1]["tokens"] if "baseline" in mine \
                        else plain_ref.get((req.prompt_id, rep))
                    others = [r.get("active", 1) - 1 for r in mine.get("baseline", []) if r["type"] == "step"]
                    if plain is not None:
                        record_divergence(pair.target, req.tokens, traces["speculative"], plain, mine["speculative"],
                                          others)
            for tw in traces.values():
                tw.close()


def plain_outputs(run_dir: Path, inst: Instance, round_: int) -> dict[tuple[str, int], list[int]]:
    """(prompt id, repeat) -> tokens of the plain baseline configuration of inst's target, offload, threads and
    policy in this round, when it has finished."""
    from harness.trace import read_records
    base = unit_id(inst.plain().id, round_)
    f = trace_file(run_dir, base)
    if finished(run_dir).get(base, {}).get("status") != "ok" or f is None:
        return {}
    return {(r["prompt_id"], r["repeat"]): r["tokens"] for r in read_records(f) if r.get("type") == "generation"}


def record_divergence(target, prompt: list[int], spec_trace, plain: list[int],
                      records: list[dict], plain_others: list[int]) -> None:
    """Where a greedy speculative output left plain decoding, re-evaluate the target there both ways (harness.
    divergence) and append what was found to the speculative trace. records: the generation's own (its steps,
    then its generation record); plain_others: how many other sequences shared each plain step."""
    from harness.divergence import blocks, kernel_check
    gen = [r for r in records if r.get("type") == "generation"][-1]
    found = kernel_check(target, prompt, gen["tokens"], blocks(records), plain, plain_others)
    if found is not None:
        spec_trace.write({"type": "divergence", "prompt_id": gen["prompt_id"], **found})


def measure_costs(pair, requests: list, k_max: int, parallel: int = 1) -> dict:
    """The decode costs over the requests' own text: calibrate.in_situ for one sequence at a time; with several,
    batches of 1, 2, 4, ... N sequences (concurrency.calibrate)."""
    text = [t for r in requests for t in r.tokens]
    if parallel > 1:
        from harness.concurrency.calibrate import batched_costs
        return batched_costs(pair.target, pair.draft_engine, text, parallel, k_max - 1)
    from harness.calibrate import in_situ, spanned_contexts
    ctxs = spanned_contexts([len(r.tokens) for r in requests], [len(r.tokens) + r.max_tokens for r in requests], k_max)
    return in_situ(pair.target, pair.draft_engine, text, k_max, ctxs, cache=pair.prompt_cache,
                   prefixes=[r.tokens[:-1] for r in requests])  # as the loop evaluates a prompt


def warm_up(pair, tokens: list[int], gamma: int) -> None:
    """One verify-sized decode on the target and one token on the draft, discarded: page in the weights and
    size the compute buffers, so that neither the first generation nor whichever of a pair runs first pays it."""
    pair.target.decode(tokens[:gamma + 1], logits="all")
    pair.target.reset()
    if pair.draft_engine:
        pair.draft_engine.decode(tokens[:1], logits="last")
        pair.draft_engine.reset()


def adaptive_controller(inst: Instance, pair, run_dir: Path, context: float):
    """One controller per category, fed by the run's calibrations at the category's context (bench checked
    they exist)."""
    from harness.calibrate import costs_at
    from harness.costmodel import AdaptiveGamma
    costs = costs_at(run_dir / "calibration", pair.target_model.name,
                     pair.draft_model.name if pair.draft_model else None, pair.target.cfg.resolved_threads(),
                     inst.ngl, inst.ngl_draft, context)
    if costs is None:
        raise HarnessError("adaptive gamma needs calibrations in the run directory: rerun bench with --calibrate")
    return AdaptiveGamma(costs, inst.gamma)


def record_attempt(attempt: str, inst: Instance, round_: int, results_dir: Path, work, **extra) -> None:
    """In a worker: run work() and record what it returned, or the error it raised, as the unit's result row
    (with `extra` fields, the peak RSS and the attempt that wrote it)."""
    try:
        res = work()
    except HarnessError as e:
        res = {"status": "error", "error": str(e)}
    except Exception as e:  # noqa: BLE001 - any failure becomes a row; the sweep goes on
        res = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    row = {"config": inst.id, "unit": unit_id(inst.id, round_), "round": round_, **inst.to_dict(), **res, **extra,
           "peak_rss_bytes": peak_rss_bytes(), "attempt": attempt}
    try:
        record_result(results_dir, row)
    except OSError:
        if multiprocessing.parent_process() is None:
            raise  # in the harness's own process (--engine server): main() says it in one line
        # a worker's row the run directory cannot take (read-only, full): no traceback here; the parent, recording
        # this exit, names the file in one line (procs.death)
        raise SystemExit(UNWRITABLE_EXIT) from None


def isolated_unit(child, inst: Instance, round_: int, results_dir: Path, args: tuple, on_start=None) -> dict:
    """child(attempt, inst.to_dict(), round_, *args) in a fresh process (on_start(pid) is told its pid); its result
    row from results_dir. A worker that dies (segfault, out of memory) before writing its result leaves an error
    row; one that dies after writing it (say, in llama.cpp's teardown) keeps its result: the traces are
    complete."""
    attempt = os.urandom(6).hex()
    unit = unit_id(inst.id, round_)
    code = run_isolated(child, attempt, inst.to_dict(), round_, *args, on_start=on_start)
    res = finished(results_dir).get(unit)
    if res is None or res.get("attempt") != attempt:
        res = {"config": inst.id, "unit": unit, "round": round_, **inst.to_dict(), "status": "error",
               "error": death(code)}
        record_result(results_dir, res)
    return res


def _child(attempt: str, inst_d: dict, round_: int, prompts: list, params: Params, run_dir: str) -> None:
    inst = Instance.from_dict(inst_d)
    record_attempt(attempt, inst, round_, Path(run_dir), lambda: run_instance(inst, round_, prompts, params,
                                                                             Path(run_dir)))


def run_in_worker(inst: Instance, round_: int, prompts: list, params: Params, run_dir: Path, on_start=None,
                  child=_child) -> dict:
    """run_instance in a fresh process."""
    return isolated_unit(child, inst, round_, run_dir, (prompts, params, str(run_dir)), on_start)
