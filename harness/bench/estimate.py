"""How long a sweep will take, term by term as the run pays it: each worker's start and model loads, each
prompt's evaluation (counted in the target's own tokens), the generations, the paired plain twins, the decode
costs each worker measures before its rows. The costs come from the run's calibrations or, without them, from a
probe of each model timed once the busy-machine guard found the machine idle: an estimate is only as good as the
costs it starts from, and a probe taken while something else runs says nothing.

The cost functions take their figures (Figures: probes and prompt lengths) and load nothing the caller has
given them, so that a test can pass its own."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from harness.bench.probe import REPS, Figures, Probe
from harness.instance import Instance
from harness.plan import Params
from harness.checkrows import JSON

ALPHA_GUESS = 0.6  # acceptance assumed for the estimate; the sweep measures the real one
# Measured on the 2-core Xeon VM, page cache warm: a spawned worker up to its first model (the interpreter, the
# worker's imports, llama.cpp's backend) 0.4 s (a model's load: bench.probe.MODEL_S, or as its probe timed it)
WORKER_S = 0.4
# and for a default run (60 prompts): choosing the timed subset from the replay's predictions 10 s, writing the
# reports 14 s
CHOOSE_S = 10.0
REPORT_S = 15.0


class Ledger:
    """What an estimate has counted so far, in the order the run pays it: the worker starts and model loads
    (load_ms), and with the prompt cache the prompt states already evaluated, keyed by model and engine
    settings as promptcache keys its files, which every later use restores in no time."""

    def __init__(self, cached: bool):
        self.cached, self.paid, self.load_ms = cached, set(), 0.0
        self.prompt_ms = 0.0  # the prompts' evaluation counted so far

    def load(self, *models: Probe) -> None:
        """A worker started and these models loaded."""
        self.load_ms += (WORKER_S + sum(m.load_s for m in models)) * 1000

    def prompts_ms(self, fig: Figures, model: str, cfg, target: str, prompts: list, uses: int = 1,
                   cacheable: bool = True) -> float:
        """ms of `model` (engine settings cfg) evaluating each prompt `uses` times: once a run with the cache
        (where the caller goes through it: `cacheable`), else at every use."""
        pr = fig.probe(model, cfg.resolved_threads(), cfg.n_gpu_layers)
        total = 0.0
        for p in prompts:
            n = uses
            if self.cached and cacheable:
                n = int((model, cfg, p.id) not in self.paid)
                self.paid.add((model, cfg, p.id))
            total += n * pr.prompt(fig.tokens(target, p))
        self.prompt_ms += total
        return total


def in_situ_ms(p: Probe, contexts: tuple[int, ...], k_max: int, starts: list[int] = ()) -> float:
    """calibrate.in_situ for one model: each context's text evaluated, but for the longest of the prompts' cached
    states that fits (`starts`, their lengths: calibrate.fill restores it, and the ledger counts its evaluation
    where the rows' own is), then REPS blocks of each size it times (calibrate.block_sizes) after it."""
    from harness.calibrate import block_sizes

    def rest(c: int) -> float:
        s = max((x for x in starts if x <= c), default=0)
        return p.prompt(c - s, start=s)
    return sum(rest(c) + REPS * sum(p.blocks(k_max, c)[k - 1] for k in block_sizes(k_max)) for c in contexts)


def batched_ms(p: Probe, n: int, block: int, target: bool, context: int = 128) -> float:
    """concurrency.calibrate.batched_costs for one model: n sequences of `context` tokens evaluated, then REPS
    decodes of m = 1, 2, 4, ... n sequences of one token each and of `block` tokens each for the target, two for
    the draft (a batch of m t tokens priced as one block of as many)."""
    from harness.concurrency.calibrate import sequence_counts
    shapes = [m * t for m in sequence_counts(n) for t in (1, block if target else 2)]
    return n * p.prompt(context) + REPS * sum(p.blocks(x, context)[-1] for x in shapes)


def instance_costs(inst: Instance, run_dir: Path | None, context: float, fig: Figures):
    """costmodel.Costs for an instance: calibrated when the run has calibrations, else from the probes (a
    verification of k tokens linear in k, from the probe's decode and block, at `context`)."""
    from harness.calibrate import costs_at
    from harness.costmodel import Costs
    from harness.engine import EngineConfig
    threads = EngineConfig(threads=inst.threads).resolved_threads()
    draft = _draft_model(inst)
    c = costs_at(run_dir / "calibration", inst.target, draft, threads, inst.ngl, inst.ngl_draft, context) \
        if run_dir else None  # a run not started yet has no calibrations
    if c is not None:
        return c
    d1 = fig.probe(draft, threads, inst.ngl_draft).decode(context) if draft else 0.0
    return Costs(fig.probe(inst.target, threads, inst.ngl).blocks(max(17, inst.gamma + 1), context), d1)


def batched_step_costs(inst: Instance, n: int, context: float, fig: Figures):
    """costmodel.BatchCosts of n sequences, from the probes: a block of k tokens each priced as one block of
    n x k tokens (as batched_ms prices the batched calibration), the draft's decode of all n as one block of n.
    Priced a sequence at a time instead, a run at N = 8 was estimated at 31.3 minutes and took 20.7 (slower Xeon
    VM)."""
    from harness.costmodel import BatchCosts
    from harness.engine import EngineConfig
    threads, draft = EngineConfig(threads=inst.threads).resolved_threads(), _draft_model(inst)
    t = fig.probe(inst.target, threads, inst.ngl).blocks(n * (inst.gamma + 1), context)
    d = fig.probe(draft, threads, inst.ngl_draft).blocks(n, context)[-1] if draft else 0.0
    return BatchCosts((n,), (t[n - 1],), (t[-1],), (d,) if draft else (), inst.gamma + 1)


def _draft_model(inst: Instance) -> str | None:
    return inst.draft.model


def generations_ms(inst: Instance, prompts: list, params: Params, run_dir: Path | None, fig: Figures,
                   ledger: Ledger) -> list[float]:
    """A timed unit's generations in the worker's order (each repeat, each prompt; bench.worker), each its
    prompt's evaluations, through the target (and its paired plain twin) and the draft model, and its tokens at
    the cost model's speed at ALPHA_GUESS (plain for a baseline or adaptive gamma) and the twin's plain one.
    Summed, part of unit_ms; each alone, its prompt's weight on the unit's progress line."""
    from harness.costmodel import expected_tokens
    if not prompts:
        return []
    draft = _draft_model(inst)
    context = _context(inst.target, prompts, params, fig)
    # N requests of a category decode together: a step's N sequences share its time
    seqs = min(inst.parallel, max(Counter(p.category for p in prompts).values()))
    c = instance_costs(inst, run_dir, context, fig) if seqs == 1 else batched_step_costs(inst, seqs, context, fig)
    plain, g = c.step_ms(0) / seqs, inst.gamma  # a step of all seqs, which share its time
    # llama.cpp's n-gram types draft only on a hit (ngram-mod nothing or n-min..n-max tokens, the others up to
    # size-m), on most steps nothing: priced as plain decoding, as adaptive gamma is, not as n-max drafts a step
    per_tok = plain if inst.baseline or inst.adaptive or inst.draft.own_gamma else \
        c.step_ms(g, ALPHA_GUESS) / expected_tokens(ALPHA_GUESS, g) / seqs
    twin = params.paired and not inst.baseline
    cacheable = inst.parallel == 1  # the worker batches several sequences without the cache
    cfg, dcfg = inst.engine_config(params.n_ctx), inst.draft_engine_config(params.n_ctx)
    out = []
    for _ in range(params.repeat):
        for p in prompts:
            ms = (params.max_tokens or p.max_tokens) * (per_tok + twin * plain)
            ms += ledger.prompts_ms(fig, inst.target, cfg, inst.target, [p], 1 + twin, cacheable)
            if draft:
                ms += ledger.prompts_ms(fig, draft, dcfg, inst.target, [p], 1, cacheable)
            out.append(ms)
    return out


def unit_ms(inst: Instance, round_: int, prompts: list, params: Params, run_dir: Path | None, fig: Figures,
            ledger: Ledger) -> float:
    """One timed unit (bench.worker.run_instance), its load in the ledger: its generations (generations_ms); in
    round 0 a speculative unit measures its decode costs (worker.measure_costs) before its generations and after
    them."""
    from harness.calibrate import spanned_contexts
    if not prompts:
        return 0.0
    draft = _draft_model(inst)
    ms = sum(generations_ms(inst, prompts, params, run_dir, fig, ledger))
    threads = inst.engine_config(params.n_ctx).resolved_threads()
    if not inst.baseline and round_ == 0:  # before the generations and after them
        n_in = [fig.tokens(inst.target, p) for p in prompts]
        n_out = [params.max_tokens or p.max_tokens for p in prompts]
        ctxs = spanned_contexts(n_in, [a + b for a, b in zip(n_in, n_out)], inst.gamma + 1)
        for model, ngl, target in ((inst.target, inst.ngl, True), (draft, inst.ngl_draft, False))[:1 + bool(draft)]:
            pr = fig.probe(model, threads, ngl)
            ms += 2 * (batched_ms(pr, inst.parallel, inst.gamma + 1, target) if inst.parallel > 1 else
                       in_situ_ms(pr, ctxs, inst.gamma + 1,
                                  [n - 1 for n in n_in] * (params.prompt_cache and inst.parallel == 1)))
    ledger.load(*(fig.probe(m, threads, n) for m, n in ((inst.target, inst.ngl), (draft, inst.ngl_draft)) if m))
    return ms


def _context(target: str, prompts: list, params: Params, fig: Figures) -> float:
    """The tokens cached where a unit's rows decode, on average: each prompt and half its output."""
    return sum(fig.tokens(target, p) + (params.max_tokens or p.max_tokens) / 2 for p in prompts) / len(prompts)


def units_s(units: list[tuple[Instance, int, list]], params: Params, run_dir: Path | None, fig: Figures,
            ledger: Ledger | None = None) -> float:
    """Seconds for the given (instance, round, prompts) units, loads included."""
    ledger = ledger or Ledger(params.prompt_cache)
    before = ledger.load_ms
    ms = sum(unit_ms(i, r, p, params, run_dir, fig, ledger) for i, r, p in units)
    return (ms + ledger.load_ms - before) / 1000


def replay_ms(base: Instance, prompts: list, models: list[str], params: Params, fig: Figures,
              ledger: Ledger) -> float:
    """One baseline's replay (bench.replay.replay_unit), its load in the ledger: its prompts (replay_prompts_ms),
    then each model's decode costs where the prompts' rows decode (calibrate.spanned_contexts, k = 1..replay_gamma
    + 1), before the prompts and after them."""
    from harness.calibrate import spanned_contexts
    cfg = base.engine_config(params.n_ctx)
    threads, k_max = cfg.resolved_threads(), params.replay_gamma + 1
    t = fig.probe(base.target, threads, base.ngl)
    ds = [fig.probe(m, threads, params.ngl_draft[0]) for m in models]
    ledger.load(t, *ds)
    if not prompts:
        return 0.0
    sizes = [(fig.tokens(base.target, p), params.max_tokens or p.max_tokens) for p in prompts]  # prompt, output
    ctxs = spanned_contexts([n for n, _ in sizes], [n + o for n, o in sizes], k_max)
    starts = [n - 1 for n, _ in sizes] * params.prompt_cache
    return 2 * sum(in_situ_ms(m, ctxs, k_max, starts) for m in [t] + ds) + \
        sum(replay_prompts_ms(base, prompts, models, params, fig, ledger))


def replay_prompts_ms(base: Instance, prompts: list, models: list[str], params: Params, fig: Figures,
                      ledger: Ledger) -> list[float]:
    """A replay's prompts in order, each: the target's batched pass along the output (sampling only) and each
    draft model's (greedy, or llama.cpp's rule swept: a token at a time; sampling: batched, besides). Each
    alone, its prompt's weight on the replay's progress line."""
    greedy = base.policy.greedy
    stepwise = greedy or "exact" in params.verify
    cfg = base.engine_config(params.n_ctx)
    dcfg = replace(cfg, n_gpu_layers=params.ngl_draft[0], cache_k=params.cache_type_k_draft[0],
                   cache_v=params.cache_type_v_draft[0])  # as replay_unit opens every draft model
    threads = cfg.resolved_threads()
    t, ds = fig.probe(base.target, threads, base.ngl), [fig.probe(m, threads, dcfg.n_gpu_layers) for m in models]
    out = []
    for p in prompts:
        n, o = fig.tokens(base.target, p), params.max_tokens or p.max_tokens
        ms = 0.0
        if not greedy:
            ms += ledger.prompts_ms(fig, base.target, cfg, base.target, [p]) + forced_ms(t, o, n)
        for m, d in zip(models, ds):
            ms += ledger.prompts_ms(fig, m, dcfg, base.target, [p], stepwise + (not greedy))
            ms += stepwise * o * d.decode(n + o / 2) + (not greedy) * forced_ms(d, o, n)
        out.append(ms)
    return out


def forced_ms(p: Probe, rows: int, context: float) -> float:
    """A teacher-forced pass (promptcache.teacher_forced): `rows` tokens in one batch, every row's logits, after
    `context` cached. Priced as a block, not as a prompt's batch: the logits of every row cost what a
    verification's do (17 rows took the 1.5B Q4_K_M 344 ms on the AMD VM, its prompt rate 186, as a block 328)."""
    return p.blocks(rows, context)[-1] if rows else 0.0


def subset_ms(instances: list[Instance], prompts: list, params: Params, run_dir: Path | None, fig: Figures,
              ledger: Ledger) -> float:
    """The timed subset (bench.subset.choose picks it after the replay), each a unit on each category's first
    timed_subset prompts: per proposer and policy, gamma 1, and the gamma the cost model predicts best at
    ALPHA_GUESS where that is not 1 (llama.cpp's n-gram types: one of them at its own gamma). The replay predicts
    each category's own, and a category whose best gamma differs adds a unit on its prompts alone: counted here as
    one more unit per proposer and policy, on one category's prompts at a gamma two above (runs have had 3 such
    units for 5 proposers and policies on an Intel Xeon VM, 5 of 36 units on an AMD EPYC VM). With timed_scope
    "answers", each answer's configuration alone: counted as the first proposer's, per policy, at its predicted
    best gamma on every category's prompts and, as another configuration answers some of them, at a gamma two
    above on one category's."""
    from harness.bench.subset import first_prompts
    firsts = first_prompts(prompts, params.timed_subset)
    chosen = [p for ps in firsts.values() for p in ps]
    one = max(firsts.values(), key=len, default=[])
    if not chosen:
        return 0.0
    if params.timed_scope == "answers":  # per baseline, its likeliest answer: a model draft's, else the first
        spec = [i for i in instances if not i.baseline and not i.adaptive and (i.gamma == 1 or i.draft.own_gamma)]
        reps = {}
        for i in sorted(spec, key=lambda i: (i.draft.model is None, bool(i.draft.own_gamma))):
            reps.setdefault(i.plain().id, i)
        return sum(_best_units(i, firsts, chosen, one, params, run_dir, fig, ledger, [])
                   for i in reps.values())
    # llama.cpp's n-gram types, one gamma each: one unit per baseline and policy, the best predicted of them
    llama = {(i.plain().id, i.policy.label): i for i in instances if i.draft.own_gamma}
    ms = sum(unit_ms(i, 0, chosen, params, run_dir, fig, ledger) for i in llama.values())
    for i in instances:
        if not (i.baseline or i.adaptive or i.gamma != 1 or i.draft.own_gamma):
            ms += _best_units(i, firsts, chosen, one, params, run_dir, fig, ledger, [1])
    return ms


def _best_units(i: Instance, firsts: dict, chosen: list, one: list, params: Params, run_dir: Path | None,
                fig: Figures, ledger: Ledger, also: list[int]) -> float:
    """A proposer's timed units: at the gamma predicted best at ALPHA_GUESS (llama.cpp's n-gram types: their own)
    and the `also` gammas on every category's prompts, and at a gamma two above on one category's."""
    from harness.costmodel import best_speculative
    if i.draft.own_gamma:
        return unit_ms(i, 0, chosen, params, run_dir, fig, ledger)
    c = instance_costs(i, run_dir, _context(i.target, chosen, params, fig), fig)
    top = min(params.replay_gamma, len(c.target_ms) - 1)
    best = best_speculative(ALPHA_GUESS, c, top)
    units = [(g, chosen) for g in dict.fromkeys((best, *also))] + [(min(best + 2, top), one)] * (len(firsts) > 1)
    return sum(unit_ms(replace(i, gamma=g), 0, ps, params, run_dir, fig, ledger) for g, ps in units)


def fidelity_ms(params: Params, prompts: list, fig: Figures, ledger: Ledger) -> float:
    """A sweep of several targets ends with `harness fidelity` (bench.run._target_fidelity): on each category's
    first prompt, the first target generates greedily; then each target, in a process of its own, evaluates
    prompt and output (no prompt cache) and times one generation."""
    from harness.bench.subset import first_prompts
    from harness.engine import EngineConfig
    firsts = [p for ps in first_prompts(prompts, 1).values() for p in ps]
    if len(params.target) < 2 or not firsts:
        return 0.0
    n, cfg, ref = params.max_tokens or 32, EngineConfig(n_ctx=params.n_ctx), params.target[0]
    lens = [fig.tokens(ref, p) for p in firsts]
    ms = 0.0
    for k, t in enumerate(params.target):
        pr = fig.probe(t, cfg.resolved_threads(), 0)
        ledger.load(pr)
        gens = len(firsts) + 1 if k == 0 else 1  # the reference's teacher outputs, and each one's timed run
        ms += ledger.prompts_ms(fig, t, cfg, ref, firsts, uses=1 + (k == 0), cacheable=False) + \
            sum(forced_ms(pr, n, x) for x in lens) + gens * n * pr.decode(sum(lens) / len(lens) + n / 2)
    return ms


def check_ms(inst: Instance, prompts: list[tuple[int, int]], params: Params, fig: Figures) -> float:
    """One answer's configuration in llama-server (crosscheck.run.measure_checks) on its prompts (prompt tokens,
    max tokens): its server and the plain twin's, each started (a model load), evaluating every prompt and
    generating its tokens at the plain pace, no prompt cache. A speculative server is priced as the plain one
    (what it gains or loses is what it measures)."""
    cfg = inst.engine_config(params.n_ctx)
    pr = fig.probe(inst.target, cfg.resolved_threads(), inst.ngl)
    one = sum(pr.prompt(n) + mt * pr.decode(n + mt / 2) for n, mt in prompts)
    return 2 * (one + (WORKER_S + pr.load_s) * 1000)


def server_check_ms(instances: list[Instance], prompts: list, params: Params, fig: Figures) -> float:
    """--server-check (bench.confirm) as the budget plans it: per target, one bottom line's check (check_ms) on the
    first prompts of every category, POOLED_MIN of them at least (crosscheck.checks), the mean over its policies.
    The run goes on checking the other bottom lines and the answers per category while its budget lasts
    (bench.confirm orders them), so this is what the cuts keep, not all it spends."""
    from harness.bench.subset import first_prompts
    from harness.crosscheck.checks import POOLED_MIN, pooled_share
    cats = first_prompts(prompts, POOLED_MIN)
    k = pooled_share(len(cats))
    pooled = [p for ps in cats.values() for p in ps[:k]]
    groups: dict[str, list[float]] = {}
    for b in instances:
        if b.baseline:
            pairs = [(fig.tokens(b.target, p), params.max_tokens or p.max_tokens) for p in pooled]
            groups.setdefault(b.target, []).append(check_ms(b, pairs, params, fig))
    return sum(sum(ms) / len(ms) for ms in groups.values())


def remaining_parts(todo: list[tuple[Instance, int, list]], instances: list[Instance], skipped: dict,
                    prompts: list, params: Params, run_dir: Path | None, plan: dict, fig: Figures) -> dict[str, float]:
    """Seconds for what is left of a run, by part, in the order the run goes: the units to run (configuration,
    round, prompts), the plain baselines' first ("evidence": the plain generation of the run's prompts, which
    everything else is replayed along, checked against or priced by) and the others'; the replay of the baselines
    not yet replayed, the timed subset if the replay has not chosen it yet, the fidelity of several targets, the
    closing baselines (drift check) of a run without one; the worker starts and model loads of all of them; the
    reports. run_dir None: a run not started yet. A resumed run's prompts are costed as not yet cached."""
    from harness.bench.replay import proposers
    from harness.rundir import DRIFT_DIR, FIDELITY_FILE, REPLAY_DIR, finished
    ledger = Ledger(params.prompt_cache)
    parts = {name: sum(unit_ms(i, r, p, params, run_dir, fig, ledger) for i, r, p in todo if i.baseline == base)
             for name, base in (("evidence", True), ("units", False))}
    live = [i for i in instances if i.id not in skipped]
    if params.replay:
        done = finished(run_dir / REPLAY_DIR) if run_dir else {}
        bases = [i for i in live if i.baseline and done.get(i.id, {}).get("status") != "ok"]
        parts["replay"] = sum(replay_ms(b, prompts, [m.model for m in proposers(instances, params, b) if m.model],
                                        params, fig, ledger) for b in bases)
    if params.timed_subset and "timed" not in plan:
        parts["timed subset"] = subset_ms(live, prompts, params, run_dir, fig, ledger) + CHOOSE_S * 1000
    if len(params.target) > 1 and not (run_dir and (run_dir / FIDELITY_FILE).exists()):
        parts["fidelity"] = fidelity_ms(params, prompts, fig, ledger)
    if not params.timed_subset and any(not i.baseline for i in live):
        done = finished(run_dir / DRIFT_DIR) if run_dir else {}
        parts["drift check"] = sum(unit_ms(i, 0, prompts, params, run_dir, fig, ledger) for i in live
                                   if i.baseline and done.get(i.id, {}).get("status") != "ok")
    if params.server_check and not (run_dir and (run_dir / JSON).exists()):
        parts["llama-server check"] = server_check_ms(live, prompts, params, fig)
    return {k: v / 1000 for k, v in parts.items()} | {"worker starts and model loads": ledger.load_ms / 1000,
                                                      "reports": REPORT_S}


def evidence_parts(todo: list[tuple[Instance, int, list]], params: Params, run_dir: Path | None,
                   fig: Figures) -> dict[str, float]:
    """remaining_parts' evidence in seconds, split: its prompts' evaluation (which with long prompts on a CPU may
    be most of it) and the generation of its tokens."""
    ledger = Ledger(params.prompt_cache)
    ms = sum(unit_ms(i, r, p, params, run_dir, fig, ledger) for i, r, p in todo if i.baseline)
    return {"prompt evaluation": ledger.prompt_ms / 1000, "generation": (ms - ledger.prompt_ms) / 1000}


def remaining_s(todo: list[tuple[Instance, int, list]], instances: list[Instance], skipped: dict, prompts: list,
                params: Params, run_dir: Path | None, plan: dict, fig: Figures) -> float:
    return sum(remaining_parts(todo, instances, skipped, prompts, params, run_dir, plan, fig).values())


class Weights:
    """Each prompt's estimated time in the units and replays of a run, for their progress lines: the estimate's
    own terms, its ledger kept across them in the run's order (a prompt evaluated in one unit is restored in the
    next). A resumed run's prompts count as not yet cached, as in remaining_parts."""

    def __init__(self, params: Params, fig: Figures):
        self.params, self.fig, self.ledger = params, fig, Ledger(params.prompt_cache)

    def unit(self, inst: Instance, prompts: list) -> list[float]:
        return generations_ms(inst, prompts, self.params, None, self.fig, self.ledger)

    def replay(self, base: Instance, prompts: list, proposers: list) -> list[float]:
        return replay_prompts_ms(base, prompts, [m.model for m in proposers if m.model], self.params, self.fig,
                                 self.ledger)
