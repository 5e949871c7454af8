"""How long a sweep will take, from the run's calibrations or, without them, from a plain decode of each model
timed once the busy-machine guard found the machine idle: an estimate is only as good as the costs it starts
from, and a probe taken while something else runs says nothing."""
from __future__ import annotations

import time
from pathlib import Path

from harness.plan import Instance, Params

ALPHA_GUESS = 0.6        # acceptance assumed for the estimate; the sweep measures the real one
PROMPT_EVAL_SHARE = 0.22  # a prompt token against a decode (1.5B on 2 CPU cores: 5.8 ms against 26; less on a GPU)
LOAD_S = 2.0             # starting a worker and loading its models


def decode_ms(ref: str, threads: int, ngl: int) -> float:
    """Median ms of a single-token decode after a short context, warm."""
    import statistics

    from harness.engine import Engine, EngineConfig
    from harness.models.catalog import resolve
    with Engine(resolve(ref).path, EngineConfig(n_ctx=256, n_batch=64, n_gpu_layers=ngl, threads=threads)) as e:
        e.decode(list(range(1, 65)), logits="last")
        times = []
        for k in range(16):
            t = time.perf_counter()
            e.decode([100 + k], logits="last")
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def unit_costs(inst: Instance, run_dir: Path | None, context: float, measured: dict):
    """costmodel.Costs for an instance: calibrated when the run has calibrations, else from measured decodes
    (a verify of k tokens taken as 1 + (k - 1) / 3 decodes, the draft's catch-up at its decode cost)."""
    from harness.calibrate import costs_at
    from harness.costmodel import Costs
    from harness.engine import EngineConfig
    from harness.pair import parse_ngram
    threads = EngineConfig(threads=inst.threads).resolved_threads()
    draft = None if inst.baseline or parse_ngram(inst.draft) is not None else inst.draft
    c = costs_at(run_dir / "calibration", inst.target, draft, threads, inst.ngl, inst.ngl_draft, context) \
        if run_dir else None  # a run not started yet has no calibrations
    if c is not None:
        return c
    t1 = _measured(measured, inst.target, threads, inst.ngl)
    d1 = _measured(measured, draft, threads, inst.ngl_draft) if draft else 0.0
    return Costs([t1 * (1 + k / 3) for k in range(17)], d1)


def _measured(measured: dict, ref: str, threads: int, ngl: int) -> float:
    key = (ref, threads, ngl)
    if key not in measured:
        measured[key] = decode_ms(ref, threads, ngl)
    return measured[key]


def _sizes(prompts: list, max_tokens: int, repeat: int) -> tuple[int, int]:
    """Generated and prompt tokens (prompts guessed at 4 characters a token) over `prompts`, `repeat` times."""
    n_tok = sum(max_tokens or p.max_tokens for p in prompts) * repeat
    n_prompt = sum(len(p.text or " ".join(c for _, c in p.messages)) // 4 for p in prompts) * repeat
    return n_tok, n_prompt


def estimate_s(units: list[tuple[Instance, list]], max_tokens: int, repeat: int, paired: bool,
               run_dir: Path | None, measured: dict | None = None) -> float:
    """Seconds for the given (instance, prompts) units: generation at the cost model's speed at ALPHA_GUESS (plain
    for adaptive gamma), prompt evaluation, the paired plain runs, worker start-up."""
    from harness.costmodel import expected_tokens
    measured = {} if measured is None else measured
    total = 0.0
    for inst, prompts in units:
        if not prompts:
            continue
        n_tok, n_prompt = _sizes(prompts, max_tokens, repeat)
        c = unit_costs(inst, run_dir, n_prompt / len(prompts) / repeat + n_tok / len(prompts) / repeat / 2, measured)
        plain_tok = c.target_ms[0]
        g = inst.gamma
        per_tok = plain_tok if inst.baseline or inst.adaptive else c.step_ms(g, ALPHA_GUESS) / expected_tokens(
            ALPHA_GUESS, g)
        runs = 1 + (paired and not inst.baseline)
        # the prompt through the target once per run, and through the draft model (a lookup has none) at its cost
        total += n_tok * (per_tok + (runs - 1) * plain_tok) + n_prompt * PROMPT_EVAL_SHARE * (
            runs * plain_tok + c.draft_ms) + LOAD_S * 1000
    return total / 1000


def replay_s(bases: list[Instance], prompts: list, models: list[str], gamma_max: int, max_tokens: int,
             run_dir: Path | None, measured: dict | None = None) -> float:
    """Seconds for the replay of each baseline: per prompt, the target's teacher-forced pass (sampling only) and
    each draft model's (greedy: a token at a time, as the loop decodes; sampling: batched); beside them, each
    model's decode costs where its rows decode (calibrate.spanned_contexts; 3 repetitions of k = 1..gamma_max + 1)."""
    from harness.calibrate import spanned_contexts
    from harness.engine import EngineConfig
    from harness.sampling import Policy
    measured = {} if measured is None else measured
    n_tok, n_prompt = _sizes(prompts, max_tokens, 1)
    lens = [_sizes([p], max_tokens, 1) for p in prompts]
    ctxs = spanned_contexts([n for _, n in lens], [n + t for t, n in lens], gamma_max + 1) if prompts else ()
    in_situ = sum(ctxs) * PROMPT_EVAL_SHARE + len(ctxs) * 3 * sum(1 + k / 3 for k in range(gamma_max + 1))
    total = 0.0
    for base in bases:
        greedy = Policy(**base.policy).greedy
        threads = EngineConfig(threads=base.threads).resolved_threads()
        total += _measured(measured, base.target, threads, base.ngl) * (
            in_situ + (0 if greedy else (n_prompt + n_tok) * PROMPT_EVAL_SHARE))
        for m in models:
            passes = n_prompt * PROMPT_EVAL_SHARE + (n_tok if greedy else n_tok * PROMPT_EVAL_SHARE)
            total += _measured(measured, m, threads, base.ngl_draft) * (in_situ + passes)
        total += LOAD_S * 1000 * (1 + len(models))
    return total / 1000


def subset_s(instances: list[Instance], prompts: list, n: int, max_tokens: int, paired: bool,
             run_dir: Path | None, measured: dict | None = None) -> float:
    """At most how long the timed subset takes (bench.subset.choose picks it after the replay): per proposer
    and policy, gamma 1 and the predicted best gamma (costed as gamma 1), on each category's first n prompts."""
    from harness.bench.subset import first_prompts
    chosen = [p for ps in first_prompts(prompts, n).values() for p in ps]
    ones = [i for i in instances if not i.baseline and not i.adaptive and i.gamma == 1]
    return 2 * estimate_s([(i, chosen) for i in ones], max_tokens, 1, paired, run_dir, measured)


def remaining_s(todo: list[tuple[Instance, int, list]], instances: list[Instance], skipped: dict, prompts: list,
                params: Params, run_dir: Path | None, plan: dict, measured: dict) -> float:
    """Seconds for what is left of a run: the units to run (configuration, round, prompts), the replay of the
    baselines not yet replayed, the timed subset if the replay has not chosen it yet. run_dir None: a run not
    started yet."""
    from harness.bench.replay import proposers
    from harness.pair import parse_ngram
    from harness.rundir import REPLAY_DIR, finished
    est = estimate_s([(i, p) for i, _, p in todo], params.max_tokens, params.repeat, params.paired, run_dir, measured)
    live = [i for i in instances if i.id not in skipped]
    if params.replay:
        done = finished(run_dir / REPLAY_DIR) if run_dir else {}
        bases = [i for i in live if i.baseline and done.get(i.id, {}).get("status") != "ok"]
        models = [p for p in proposers(instances, params) if parse_ngram(p) is None]
        est += replay_s(bases, prompts, models, params.replay_gamma, params.max_tokens, run_dir, measured)
    if params.timed_subset and "timed" not in plan:
        est += subset_s(live, prompts, params.timed_subset, params.max_tokens, params.paired, run_dir, measured)
    return est
