"""How long a sweep will take, term by term as the run pays it: each worker's start and model loads, each
prompt's evaluation (counted in the target's own tokens), the generations, the paired plain twins, the decode
costs each worker measures before its rows. The costs come from the run's calibrations or, without them, from a
probe of each model timed once the busy-machine guard found the machine idle: an estimate is only as good as the
costs it starts from, and a probe taken while something else runs says nothing.

The cost functions take their figures (Figures: probes and prompt lengths) and load nothing the caller has
given them, so that a test can pass its own."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from harness.plan import Instance, Params

ALPHA_GUESS = 0.6  # acceptance assumed for the estimate; the sweep measures the real one
CHUNK = 256  # tokens a probe evaluates as a prompt, twice: cached positions 0..CHUNK, then CHUNK..2 CHUNK
BLOCK = 8  # the verify-sized block a probe times (gamma 7): the step from one token to a block is linear
REPS = 3  # calibrate.in_situ's repetitions of each block
# A probe this recent, of the same file with the same settings, build and machine, is taken from the cache
# rather than timed again: a dry run and then the run, or a test suite's many short runs, where probing a small
# model (7 s on a slow Xeon VM) cost more than the run itself
PROBE_TTL_S = 600
# Measured on the 2-core Xeon VM, page cache warm: a spawned worker up to its first model (the interpreter, the
# worker's imports, llama.cpp's backend) 0.4 s; a model loaded with a 2048-token context 0.3 s (0.5B Q4_K_M and
# Q4_0, 1.5B F16) to 0.7 s (1.5B Q4_K_M, whose weights are repacked)
WORKER_S = 0.4
MODEL_S = 0.5
# and for a default run (60 prompts): choosing the timed subset from the replay's predictions 10 s, writing the
# reports 14 s
CHOOSE_S = 10.0
REPORT_S = 15.0


@dataclass(frozen=True)
class Probe:
    """A model's speed on this machine, linear in the tokens already cached (attention grows with them: on the
    2-core VM a prompt token at position 900 costs the 1.5B 12% more than at 100, the 0.5B 30%): a prompt token
    evaluated in a batch and one decode, at context 0 and their growth per cached token; what each further token
    of a verify-sized block adds to a decode; what blocks of 2..BLOCK tokens add to one, each timed (the step is
    not linear: on the Xeon VM the 1.5B Q4_K_M's 3-token block costs more than its 4-token one, and its 2- and
    3-token blocks 25-30% more than the line through 1 and 8 tokens); the model's load, as timed (0.3-0.7 s on
    one VM, 2 s on another)."""
    prompt_ms: float
    prompt_growth: float
    decode_ms: float
    decode_growth: float
    block_step_ms: float
    block_extra_ms: tuple[float, ...] = ()  # k = 2..BLOCK: a block's cost over a decode at the same context
    load_s: float = MODEL_S

    def prompt(self, n: float, start: float = 0) -> float:
        """ms of evaluating n tokens in batches after `start` cached."""
        return n * (self.prompt_ms + self.prompt_growth * (start + n / 2))

    def decode(self, context: float) -> float:
        return self.decode_ms + self.decode_growth * context

    def blocks(self, k_max: int, context: float) -> list[float]:
        """ms of a decode of k = 1..k_max tokens (all logits) after `context` cached."""
        extra = (0.0, *self.block_extra_ms)
        return [self.decode(context) + (extra[k - 1] if k <= len(extra) else
                                        extra[-1] + (k - len(extra)) * self.block_step_ms)
                for k in range(1, k_max + 1)]


def probe(ref: str, threads: int, ngl: int) -> Probe:
    """Probe a model, warm: its load, decodes after a few tokens and after 2 CHUNK (the median of 8 each), each
    prompt chunk timed once (seconds of work), blocks of 2..BLOCK tokens after 2 CHUNK (the median of 3, sizes in
    turn as calibrate.in_situ times them)."""
    import statistics

    from harness.engine import Engine, EngineConfig
    from harness.models.catalog import resolve
    toks = list(range(1, 2 * CHUNK + 1))

    def decodes() -> float:
        return statistics.median(_ms(e.decode, [100 + k], logits="last") for k in range(8))

    with Engine(resolve(ref).path, EngineConfig(n_ctx=2 * CHUNK + 64, n_gpu_layers=ngl, threads=threads)) as e:
        e.decode(toks[:8], logits="last")  # pages the weights in
        decode, prompt = [(12, decodes())], []  # (mean context, ms)
        e.trim(0)
        for start in (0, CHUNK):
            prompt.append(_ms(e.decode, toks[start:start + CHUNK], logits="none") / CHUNK)
        decode.append((2 * CHUNK + 4, decodes()))
        block: dict[int, list[float]] = {k: [] for k in range(2, BLOCK + 1)}
        for _ in range(3):
            for k in block:
                e.trim(2 * CHUNK)
                block[k].append(_ms(e.decode, toks[:k], logits="all"))
        load_s = e.load_ms / 1000
    # the chunks' mean positions lie CHUNK apart; a timing's noise is no shrinking
    prompt_growth = max(prompt[1] - prompt[0], 0.0) / CHUNK
    (c0, d0), (c1, d1) = decode
    decode_growth = max(d1 - d0, 0.0) / (c1 - c0)
    extra = tuple(max(statistics.median(t) - d1, 0.0) for t in block.values())
    return Probe(prompt[0] - prompt_growth * CHUNK / 2, prompt_growth, d0 - decode_growth * c0, decode_growth,
                 extra[-1] / (BLOCK - 1), extra, load_s)


def probe_cache() -> Path:
    """Where recent probes are kept: $HARNESS_CACHE (else ~/.cache/harness)/probes.json."""
    return Path(os.environ.get("HARNESS_CACHE") or Path.home() / ".cache" / "harness") / "probes.json"


def recent_probe(ref: str, threads: int, ngl: int) -> tuple[Probe, float]:
    """The model's probe and its age in seconds: from the cache where one under PROBE_TTL_S old has the same model
    file (path, size, mtime), threads, offload, llama-cpp-python and machine; else timed now and cached."""
    import json
    import socket
    from dataclasses import asdict
    from importlib.metadata import version

    from harness.engine import EngineConfig
    from harness.models.catalog import resolve
    from harness.sysinfo import cpu_model
    path = Path(resolve(ref).path).resolve()
    st = path.stat()
    key = "|".join(map(str, (path, st.st_size, st.st_mtime_ns, EngineConfig(threads=threads).resolved_threads(), ngl,
                             version("llama-cpp-python"), socket.gethostname(), cpu_model())))
    f, now = probe_cache(), time.time()
    try:
        cache = {k: v for k, v in json.loads(f.read_text()).items() if 0 <= now - v["at"] < PROBE_TTL_S}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # none yet, or not one this code wrote
        cache = {}
    if key in cache:
        got = cache[key]["probe"]
        return Probe(**got | {"block_extra_ms": tuple(got["block_extra_ms"])}), now - cache[key]["at"]
    p = probe(ref, threads, ngl)
    cache[key] = {"at": time.time(), "probe": asdict(p)}
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(f)
    except OSError:  # a cache that cannot be written costs only the next run's probe
        pass
    return p, 0.0


def _ms(work, *args, **kw) -> float:
    t = time.perf_counter()
    work(*args, **kw)
    return (time.perf_counter() - t) * 1000


class Figures:
    """What estimates start from, each measured once and kept: a Probe per (model, threads, ngl), and each
    prompt's length in its target's tokens (the chat template applied), per (target, prompt id), from the
    target's vocabulary alone (fast to load). Given entries are used as they are."""

    def __init__(self, probes: dict | None = None, lengths: dict | None = None):
        self.probes = {} if probes is None else probes
        self.lengths = {} if lengths is None else lengths
        self.ages: dict = {}  # seconds since each probe was timed, where taken from the cache
        self._vocabs: dict = {}

    def probe(self, ref: str, threads: int, ngl: int) -> Probe:
        key = (ref, threads, ngl)
        if key not in self.probes:
            self.probes[key], age = recent_probe(ref, threads, ngl)
            if age:
                self.ages[key] = age
        return self.probes[key]

    def source(self) -> str:
        """What the estimate starts from, as its line says."""
        line = "a probe of each model (a prompt evaluated, decodes), timed on the idle machine"
        if self.ages:
            m = max(self.ages.values()) / 60
            line += f" ({len(self.ages)} of them {f'up to {m:.0f} min' if m >= 1 else 'under a minute'} ago, kept)"
        return line

    def tokens(self, target: str, prompt) -> int:
        key = (target, prompt.id)
        if key not in self.lengths:
            if target not in self._vocabs:
                from harness.engine import Vocab, load_model
                from harness.models.catalog import resolve
                self._vocabs[target] = Vocab(load_model(resolve(target).path, vocab_only=True))
            v = self._vocabs[target]
            self.lengths[key] = len(v.tokenize(prompt.render(v)))
        return self.lengths[key]

    def describe(self) -> str:
        """The probes taken, as a dry run reports them."""
        return "; ".join(f"{ref}: a prompt token {p.prompt_ms:.1f} ms and a decode {p.decode_ms:.1f} ms at context 0, "
                         f"{p.prompt_growth * 1000:.1f} and {p.decode_growth * 1000:.1f} ms more per 1000 cached; "
                         f"{p.block_step_ms:.1f} ms a further token of a block; loaded in {p.load_s:.1f} s"
                         for (ref, _, _), p in self.probes.items()) or "none"


class Ledger:
    """What an estimate has counted so far, in the order the run pays it: the worker starts and model loads
    (load_ms), and with the prompt cache the prompt states already evaluated, keyed by model and engine
    settings as promptcache keys its files, which every later use restores in no time."""

    def __init__(self, cached: bool):
        self.cached, self.paid, self.load_ms = cached, set(), 0.0

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
        return total


def in_situ_ms(p: Probe, contexts: tuple[int, ...], k_max: int, starts: list[int] = ()) -> float:
    """calibrate.in_situ for one model: each context's text evaluated, but for the longest of the prompts' cached
    states that fits (`starts`, their lengths: calibrate.fill restores it, and the ledger counts its evaluation
    where the rows' own is), then REPS blocks of k = 1..k_max after it."""
    def rest(c: int) -> float:
        s = max((x for x in starts if x <= c), default=0)
        return p.prompt(c - s, start=s)
    return sum(rest(c) + REPS * sum(p.blocks(k_max, c)) for c in contexts)


def batched_ms(p: Probe, n: int, block: int, target: bool, context: int = 128) -> float:
    """concurrency.calibrate.batched_costs for one model: n sequences of `context` tokens evaluated, then REPS
    decodes of m = 1, 2, 4, ... n sequences of one token each and, for the target, of `block` tokens each (a
    batch of m t tokens priced as one block of as many)."""
    from harness.concurrency.calibrate import sequence_counts
    shapes = [m * t for m in sequence_counts(n) for t in ((1, block) if target else (1,))]
    return n * p.prompt(context) + REPS * sum(p.blocks(x, context)[-1] for x in shapes)


def unit_costs(inst: Instance, run_dir: Path | None, context: float, fig: Figures):
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


def _draft_model(inst: Instance) -> str | None:
    from harness.pair import parse_ngram
    return None if inst.baseline or parse_ngram(inst.draft) is not None else inst.draft


def unit_ms(inst: Instance, round_: int, prompts: list, params: Params, run_dir: Path | None, fig: Figures,
            ledger: Ledger) -> float:
    """One timed unit (bench.worker.run_instance), its load in the ledger: per prompt and repeat, the prompt
    through the target (and its paired plain twin) and the draft model, the generation at the cost model's
    speed at ALPHA_GUESS (plain for a baseline or adaptive gamma) and the twin's plain one; in round 0 a
    speculative unit measures its decode costs (worker.measure_costs) before its generations and after them."""
    from harness.calibrate import spanned_contexts
    from harness.costmodel import expected_tokens
    if not prompts:
        return 0.0
    draft = _draft_model(inst)
    n_in = [fig.tokens(inst.target, p) for p in prompts]
    n_out = [params.max_tokens or p.max_tokens for p in prompts]
    c = unit_costs(inst, run_dir, _context(inst.target, prompts, params, fig), fig)
    plain, g = c.target_ms[0], inst.gamma
    per_tok = plain if inst.baseline or inst.adaptive else c.step_ms(g, ALPHA_GUESS) / expected_tokens(ALPHA_GUESS, g)
    twin = params.paired and not inst.baseline
    cacheable = inst.parallel == 1  # the worker batches several sequences without the cache
    cfg, dcfg = inst.engine_config(params.n_ctx), inst.draft_engine_config(params.n_ctx)
    threads = cfg.resolved_threads()
    ms = sum(n_out) * params.repeat * (per_tok + twin * plain)
    ms += ledger.prompts_ms(fig, inst.target, cfg, inst.target, prompts, params.repeat * (1 + twin), cacheable)
    if draft:
        ms += ledger.prompts_ms(fig, draft, dcfg, inst.target, prompts, params.repeat, cacheable)
    if not inst.baseline and round_ == 0:  # before the generations and after them
        ctxs = spanned_contexts(n_in, [a + b for a, b in zip(n_in, n_out)], g + 1)
        for model, ngl, target in ((inst.target, inst.ngl, True), (draft, inst.ngl_draft, False))[:1 + bool(draft)]:
            pr = fig.probe(model, threads, ngl)
            ms += 2 * (batched_ms(pr, inst.parallel, g + 1, target) if inst.parallel > 1 else
                       in_situ_ms(pr, ctxs, g + 1, [n - 1 for n in n_in] * (params.prompt_cache and cacheable)))
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
    """One baseline's replay (bench.replay.replay_unit), its load in the ledger: per prompt, the target's
    batched pass along the output (sampling only) and each draft model's (greedy, or llama.cpp's rule swept:
    a token at a time; sampling: batched, besides); then each model's decode costs where the prompts' rows
    decode (calibrate.spanned_contexts, k = 1..replay_gamma + 1)."""
    from harness.calibrate import spanned_contexts
    from harness.sampling import Policy
    greedy = Policy(**base.policy).greedy
    stepwise = greedy or "exact" in params.verify
    cfg = base.engine_config(params.n_ctx)
    dcfg = replace(cfg, n_gpu_layers=params.ngl_draft[0], cache_k=params.cache_type_k_draft[0],
                   cache_v=params.cache_type_v_draft[0])  # as replay_unit opens every draft model
    threads, k_max = cfg.resolved_threads(), params.replay_gamma + 1
    t, ds = fig.probe(base.target, threads, base.ngl), [fig.probe(m, threads, dcfg.n_gpu_layers) for m in models]
    ledger.load(t, *ds)
    if not prompts:
        return 0.0
    sizes = [(fig.tokens(base.target, p), params.max_tokens or p.max_tokens) for p in prompts]  # prompt, output
    ctxs = spanned_contexts([n for n, _ in sizes], [n + o for n, o in sizes], k_max)
    starts = [n - 1 for n, _ in sizes] * params.prompt_cache
    ms = 2 * in_situ_ms(t, ctxs, k_max, starts)  # the costs are measured before the prompts and after them
    if not greedy:
        ms += ledger.prompts_ms(fig, base.target, cfg, base.target, prompts) + sum(t.prompt(o, n) for n, o in sizes)
    for m, d in zip(models, ds):
        ms += 2 * in_situ_ms(d, ctxs, k_max, starts) + ledger.prompts_ms(fig, m, dcfg, base.target, prompts,
                                                             stepwise + (not greedy))
        ms += sum(stepwise * o * d.decode(n + o / 2) + (not greedy) * d.prompt(o, n) for n, o in sizes)
    return ms


def subset_ms(instances: list[Instance], prompts: list, params: Params, run_dir: Path | None, fig: Figures,
              ledger: Ledger) -> float:
    """The timed subset (bench.subset.choose picks it after the replay), each a unit on each category's first
    timed_subset prompts: per proposer and policy, gamma 1, and the gamma the cost model predicts best at
    ALPHA_GUESS where that is not 1. The replay predicts each category's own, and a category whose best gamma
    differs adds a unit on its prompts alone: counted here as one more unit per proposer and policy, on one
    category's prompts at a gamma two above (runs have had 3 such units for 5 proposers and policies on an Intel
    Xeon VM, 5 of 36 units on an AMD EPYC VM)."""
    from harness.bench.subset import first_prompts
    from harness.costmodel import best_speculative
    firsts = first_prompts(prompts, params.timed_subset)
    chosen = [p for ps in firsts.values() for p in ps]
    one = max(firsts.values(), key=len, default=[])
    ms = 0.0
    for i in instances:
        if i.baseline or i.adaptive or i.gamma != 1 or not chosen:
            continue
        c = unit_costs(i, run_dir, _context(i.target, chosen, params, fig), fig)
        top = min(params.replay_gamma, len(c.target_ms) - 1)
        best = best_speculative(ALPHA_GUESS, c, top)
        units = [(g, chosen) for g in dict.fromkeys((best, 1))] + [(min(best + 2, top), one)] * (len(firsts) > 1)
        ms += sum(unit_ms(replace(i, gamma=g), 0, ps, params, run_dir, fig, ledger) for g, ps in units)
    return ms


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
            sum(pr.prompt(n, start=x) for x in lens) + gens * n * pr.decode(sum(lens) / len(lens) + n / 2)
    return ms


def remaining_parts(todo: list[tuple[Instance, int, list]], instances: list[Instance], skipped: dict,
                    prompts: list, params: Params, run_dir: Path | None, plan: dict, fig: Figures) -> dict[str, float]:
    """Seconds for what is left of a run, by part, in the order the run goes: the units to run
    (configuration, round, prompts), the replay of the baselines not yet replayed, the timed subset if the
    replay has not chosen it yet, the fidelity of several targets, the closing baselines (drift check) of a run
    without one; the worker starts and model loads of all of them; the reports. run_dir None: a run not started
    yet. A resumed run's prompts are costed as not yet cached."""
    from harness.bench.replay import proposers
    from harness.pair import parse_ngram
    from harness.rundir import DRIFT_DIR, FIDELITY_FILE, REPLAY_DIR, finished
    ledger = Ledger(params.prompt_cache)
    parts = {"units": sum(unit_ms(i, r, p, params, run_dir, fig, ledger) for i, r, p in todo)}
    live = [i for i in instances if i.id not in skipped]
    if params.replay:
        done = finished(run_dir / REPLAY_DIR) if run_dir else {}
        bases = [i for i in live if i.baseline and done.get(i.id, {}).get("status") != "ok"]
        parts["replay"] = sum(replay_ms(b, prompts, [m for m in proposers(instances, params, b)
                                                     if parse_ngram(m) is None], params, fig, ledger) for b in bases)
    if params.timed_subset and "timed" not in plan:
        parts["timed subset"] = subset_ms(live, prompts, params, run_dir, fig, ledger) + CHOOSE_S * 1000
    if len(params.target) > 1 and not (run_dir and (run_dir / FIDELITY_FILE).exists()):
        parts["fidelity"] = fidelity_ms(params, prompts, fig, ledger)
    if not params.timed_subset and any(not i.baseline for i in live):
        done = finished(run_dir / DRIFT_DIR) if run_dir else {}
        parts["drift check"] = sum(unit_ms(i, 0, prompts, params, run_dir, fig, ledger) for i in live
                                   if i.baseline and done.get(i.id, {}).get("status") != "ok")
    return {k: v / 1000 for k, v in parts.items()} | {"worker starts and model loads": ledger.load_ms / 1000,
                                                      "reports": REPORT_S}


def remaining_s(todo: list[tuple[Instance, int, list]], instances: list[Instance], skipped: dict, prompts: list,
                params: Params, run_dir: Path | None, plan: dict, fig: Figures) -> float:
    return sum(remaining_parts(todo, instances, skipped, prompts, params, run_dir, plan, fig).values())
