"""A benchmark plan: one parameter set (a profile, then the command line) expanded into instances, llama-bench
style: the product of every list."""
from __future__ import annotations

import itertools
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from harness.analysis.verdict import MIN_GAIN
from harness.drafting import Drafting
from harness.engine import MIN_CTX
from harness.errors import HarnessError
from harness.gamma import N_BATCH, require_fits_batch
from harness.prompts import load, read_text
from harness.sampling import Policy
from harness.instance import Instance
from harness.specs import DraftSpec, Gamma, NoDraft, parse_draft, parse_gamma

LIST_KEYS = ("target", "draft", "gamma", "temp", "top_p", "top_k", "min_p", "ngl", "ngl_draft", "threads", "verify",
             "draft_p_min", "draft_n_min", "cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft",
             "flash_attn", "ubatch", "parallel", "kv_unified")
SCALAR_KEYS = ("categories", "prompts", "per_category", "max_tokens", "prompt_chars", "repeat", "seed", "n_ctx",
               "calibrate", "paired", "until_confident", "budget_min", "busy_threshold", "replay", "replay_gamma",
               "timed_subset", "timed_scope", "min_gain", "prompt_cache", "also", "engine", "llama_server",
               "server_check", "start_timeout", "request_timeout")
# the timed subset: every proposer's predicted best gamma and gamma 1 per category and policy (and each answer's
# configuration), or each answer's configuration alone (bench.subset.choose)
TIMED_SCOPES = ("proposers", "answers")
ENGINES = ("harness", "server")  # who generates: the harness's own loop, or llama-server (harness.bench.serverunit)


def profiles_file() -> Path:
    return Path(os.environ.get("HARNESS_PROFILES", "profiles.toml"))


@dataclass
class Params:
    target: list[str] = field(default_factory=list)
    draft: list[DraftSpec] = field(default_factory=lambda: [NoDraft()])
    gamma: list[Gamma] = field(default_factory=lambda: [Gamma(4)])
    temp: list[float] = field(default_factory=lambda: [0.0])
    top_p: list[float] = field(default_factory=lambda: [1.0])
    top_k: list[int] = field(default_factory=lambda: [0])
    min_p: list[float] = field(default_factory=lambda: [0.0])
    ngl: list[int] = field(default_factory=lambda: [0])
    ngl_draft: list[int] = field(default_factory=lambda: [0])
    threads: list[int] = field(default_factory=lambda: [0])
    verify: list[str] = field(default_factory=lambda: ["leviathan"])  # drafting.RULES
    draft_p_min: list[float] = field(default_factory=lambda: [0.0])
    draft_n_min: list[int] = field(default_factory=lambda: [0])
    cache_type_k: list[str] = field(default_factory=lambda: ["f16"])  # engine.CACHE_TYPES
    cache_type_v: list[str] = field(default_factory=lambda: ["f16"])
    cache_type_k_draft: list[str] = field(default_factory=lambda: ["f16"])
    cache_type_v_draft: list[str] = field(default_factory=lambda: ["f16"])
    flash_attn: list[str] = field(default_factory=lambda: ["auto"])  # both models, as llama.cpp's -fa
    ubatch: list[int] = field(default_factory=lambda: [512])  # both models' n_ubatch
    parallel: list[int] = field(default_factory=lambda: [1])  # requests decoded together (llama-server's -np)
    kv_unified: list[str] = field(default_factory=lambda: ["off"])  # on: their KV in one buffer (-kvu)
    categories: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    per_category: int = 0
    max_tokens: int = 0  # 0: each prompt's own max_tokens
    prompt_chars: int = 0  # each prompt in at most this many characters, cut in its middle (0: whole)
    repeat: int = 1
    seed: int = 0
    n_ctx: int = 2048
    calibrate: bool = False
    paired: bool = False  # a plain generation beside every speculative one, in the same worker
    until_confident: bool = False  # add prompts to categories whose verdict is inconclusive, round by round
    budget_min: float | None = None  # the whole run's minutes: cut to fit (bench.budget), no rounds beyond
    busy_threshold: float = 0.05  # share of all cores other processes may use before the machine is busy
    replay: bool = False  # teacher-force every draft along the baselines' outputs: acceptance at every gamma
    replay_gamma: int = 8  # ...up to this gamma
    timed_subset: int = 0  # with replay: time only each proposer's predicted best gamma and gamma 1 per category,
    # on its first N prompts (0: time every configuration on every prompt)
    timed_scope: str = "proposers"  # TIMED_SCOPES: what the timed subset times
    min_gain: float = MIN_GAIN  # the least gain worth having over plain decoding
    prompt_cache: bool = False  # each model evaluates each prompt once a run; later uses restore its KV state
    also: list = field(default_factory=list)  # further sweeps: dicts of list keys replacing this one's
    engine: str = "harness"  # ENGINES
    llama_server: str = ""  # with engine server: the llama-server to run ("": make native's, binary.find)
    server_check: int = 0  # each answer's configuration run in llama-server on its category's first N prompts
    start_timeout: float = 300.0  # seconds a llama-server may take to answer /health (--engine server, --server-check)
    request_timeout: float = 600.0  # ...and to answer a request

    def __post_init__(self):
        # the one place drafts and gammas are read: every Params holds them typed
        self.draft = [parse_draft(x) for x in self.draft]
        self.gamma = [parse_gamma(x) for x in self.gamma]

    def to_dict(self) -> dict:
        """As plan.json holds it: drafts and gammas as the strings (and ints) they are given as."""
        return asdict(self) | {"draft": [str(d) for d in self.draft], "gamma": [g.json() for g in self.gamma]}

    @classmethod
    def from_dict(cls, d: dict) -> "Params":
        return cls(**d)


def load_profile(name: str, path: Path | None = None) -> dict:
    path = path or profiles_file()
    if not path.exists():
        raise HarnessError(f"profiles file {path} not found")
    try:
        profiles = tomllib.loads(read_text(path, "profiles file")).get("profiles", {})
    except tomllib.TOMLDecodeError as e:
        raise HarnessError(f"{path} is not valid TOML: {e}") from None
    if not isinstance(profiles, dict):
        raise HarnessError(f"{path}: 'profiles' must be a table of profiles ([profiles.NAME] sections), "
                           f"got {profiles!r}")
    if name not in profiles:
        raise HarnessError(f"unknown profile '{name}' (known: {', '.join(profiles) or 'none'}) in {path}")
    prof = profiles[name]
    if not isinstance(prof, dict):
        raise HarnessError(f"{path}: profile '{name}' must be a table of options ([profiles.{name}]), got {prof!r}")
    unknown = set(prof) - set(LIST_KEYS) - set(SCALAR_KEYS)
    if unknown:
        raise HarnessError(f"profile '{name}' has unknown keys: {', '.join(sorted(unknown))}")
    return prof


SCALAR_TYPES = {"per_category": int, "max_tokens": int, "prompt_chars": int, "repeat": int, "seed": int, "n_ctx": int,
                "calibrate": bool, "paired": bool, "until_confident": bool, "budget_min": (int, float),
                "busy_threshold": (int, float), "replay": bool, "replay_gamma": int, "timed_subset": int,
                "timed_scope": str, "min_gain": (int, float), "prompt_cache": bool, "also": list, "engine": str,
                "llama_server": str, "server_check": int, "start_timeout": (int, float),
                "request_timeout": (int, float)}


def make_params(profile: dict, overrides: dict) -> Params:
    """Profile values, then command-line overrides (lists given as 'a,b,c' strings)."""
    p = Params()
    for where, src in (("in the profile", profile), ("on the command line", overrides)):
        for k, v in src.items():
            if v is None:
                continue
            if k in LIST_KEYS:
                v = _as_list(k, v)
            elif k in ("categories", "prompts"):
                if not isinstance(v, (str, list)):
                    raise HarnessError(f"{k} must be a list of names, got {v!r} ({where})")
                v = [x for x in (v.split(",") if isinstance(v, str) else v) if x]
                if not all(isinstance(x, str) for x in v):
                    raise HarnessError(f"{k} must be a list of names, got {src[k]!r} ({where})")
                v = list(dict.fromkeys(v))  # one given twice is one
            elif not isinstance(v, SCALAR_TYPES[k]) or (SCALAR_TYPES[k] is not bool and isinstance(v, bool)):
                want = {bool: "true or false", int: "an integer"}.get(SCALAR_TYPES[k], "a number")
                raise HarnessError(f"{k} must be {want}, got {v!r} ({where})")
            setattr(p, k, v)
    if not p.target:
        raise HarnessError("no target: give --target or a --profile")
    if p.engine == "server":  # llama-server's figures are per request: a plain twin beside each is the reference
        if False in (profile.get("paired"), overrides.get("paired")):
            raise HarnessError("--engine server runs each speculative request beside its plain twin (ABBA): leave "
                               "out --no-paired")
        p.paired = True
    # a list given on the command line replaces the profile's, in its further sweeps too: those that set it go
    given = {k for k, v in overrides.items() if v is not None and k in LIST_KEYS}
    p.also = [a for a in p.also if not (isinstance(a, dict) and set(a) & given)]
    for q in [p, *(_also(p, a) for a in p.also)]:
        check(q)
    return p


def check(p: Params) -> None:
    """Values that cannot run, refused in one line before anything starts."""
    _check_finite(p)
    if p.n_ctx < MIN_CTX:
        raise HarnessError(f"--n-ctx must be at least {MIN_CTX}, got {p.n_ctx}")
    for what, ok in (("--repeat must be >= 1", p.repeat >= 1), ("--max-tokens must be >= 0 (0 = each prompt's own)",
                     p.max_tokens >= 0), ("--per-category must be >= 0 (0 = every prompt)", p.per_category >= 0),
                     ("--prompt-chars must be >= 0 (0 = whole prompts)", p.prompt_chars >= 0),
                     (f"--kv-unified takes on, off or both, got {p.kv_unified}", set(p.kv_unified) <= {"on", "off"}),
                     (f"--seed must be >= 0, got {p.seed}", p.seed >= 0),
                     (f"--max-tokens {p.max_tokens} leaves no room for a prompt in --n-ctx {p.n_ctx}: lower "
                      "--max-tokens or raise --n-ctx", p.max_tokens < p.n_ctx)):
        if not ok:
            raise HarnessError(what)
    for key in ("threads", "ngl", "ngl_draft"):
        bad = [v for v in getattr(p, key) if v < 0]
        if bad:
            raise HarnessError(f"--{key.replace('_', '-')} values must be >= 0, got {bad[0]}")
    cores = os.cpu_count() or 1
    if max(p.threads, default=0) > cores:
        raise HarnessError(f"--threads {max(p.threads)} exceeds this machine's {cores} logical cores: give at most "
                           f"{cores} (0 = its physical cores)")
    _check_n_min(p)
    if p.budget_min is not None and p.budget_min <= 0:
        raise HarnessError(f"--budget-min must be above 0 (minutes), got {p.budget_min:g}")
    if not 0 <= p.min_gain < 1:
        raise HarnessError(f"--min-gain is the least gain worth having, a fraction from 0 to below 1 (0.05 = 5%), "
                           f"got {p.min_gain:g}")
    if p.replay_gamma < 1:
        raise HarnessError(f"--replay-gamma must be >= 1, got {p.replay_gamma}")
    if p.replay_gamma != Params.replay_gamma and not p.replay:
        raise HarnessError(f"--replay-gamma {p.replay_gamma} sets how far the replay goes: give --replay with it")
    if p.server_check < 0 or (p.server_check and p.engine == "server"):
        raise HarnessError("--server-check N (N >= 1 prompts per category) runs each answer in llama-server after the "
                           "harness's own measurements; with --engine server they are llama-server's already")
    for key in ("start_timeout", "request_timeout"):
        name, v = "--" + key.replace("_", "-"), getattr(p, key)
        if v <= 0:
            raise HarnessError(f"{name} must be a number of seconds above 0, got {v:g}")
        if v != getattr(Params, key) and p.engine != "server" and not p.server_check:
            raise HarnessError(f"{name} bounds a llama-server's wait: give --engine server or --server-check with it")
    if p.timed_subset < 0 or (p.timed_subset and not p.replay):
        raise HarnessError("--timed-subset N (N >= 1 prompts per category) times what the replay chose: give --replay")
    if p.timed_scope not in TIMED_SCOPES:
        raise HarnessError(f"--timed-scope takes {' or '.join(TIMED_SCOPES)}, got {p.timed_scope!r}")
    if p.timed_subset and p.until_confident:
        raise HarnessError("--until-confident adds prompts to timed configurations; with --timed-subset every prompt "
                           "is replayed already: give one or the other")
    if p.timed_subset and (any(p.draft_p_min) or any(p.draft_n_min)):
        raise HarnessError("--draft-p-min/--draft-n-min are not replayed, so --timed-subset would never time them: "
                           "sweep them without --timed-subset")
    engine_knobs = any(getattr(p, k) != getattr(Params(), k) for k in ENGINE_KEYS)
    if engine_knobs and (p.calibrate or any(g.adaptive for g in p.gamma)):
        raise HarnessError("calibrations (--calibrate, and auto gamma's controller) are taken at f16 KV caches, flash "
                           "attention auto and ubatch 512: sweep --cache-type-*, --flash-attn and --ubatch with "
                           "fixed gammas and without --calibrate")
    if p.replay and max(len(p.cache_type_k_draft), len(p.cache_type_v_draft), len(p.ngl_draft)) > 1:
        raise HarnessError("the replay names each draft by its model alone: sweep --ngl-draft and "
                           "--cache-type-k-draft/-v-draft without --replay, or replay one value of each per run")
    if any(v < 1 for v in p.ubatch):
        raise HarnessError(f"--ubatch values must be >= 1, got {min(p.ubatch)}")
    check_parallel(p)
    _check_own_gamma(p)
    _check_engine(p)
    if not 0 < p.busy_threshold <= 1:
        raise HarnessError(f"--busy-threshold must be in (0, 1] (a share of all cores), got {p.busy_threshold:g}")


def _check_finite(p: Params) -> None:
    """nan passes every range check (each comparison is false) and inf slips past most: every float refused."""
    for f in fields(p):
        v = getattr(p, f.name)
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, float) and not math.isfinite(x):
                raise HarnessError(f"--{f.name.replace('_', '-')} must be a finite number, got {x}")


def _check_n_min(p: Params) -> None:
    """A model draft shorter than --draft-n-min is dropped, and no draft is longer than gamma: n-min above a
    gamma the sweep pairs it with would never speculate."""
    if not any(d.model for d in p.draft):
        return  # an n-gram lookup has no n-min
    for nm in p.draft_n_min:
        low = [g.n for g in p.gamma if g.n and nm > g.n]
        if low:
            raise HarnessError(f"--draft-n-min {nm} exceeds --gamma {min(low)}: a draft is at most gamma tokens and "
                               "one shorter than n-min is dropped, so it would never speculate; give n-min <= gamma")


def _check_own_gamma(p: Params) -> None:
    """llama.cpp's n-gram types (specs.LlamaNgram): harness.llamangram serves one sequence (the replay prices
    them at their own gamma), and a step verifies their longest draft in one batch."""
    for d in p.draft:
        if not d.own_gamma:
            continue
        if max(p.parallel) > 1:
            raise HarnessError(f"{d} is not served to several requests yet: sweep it without --parallel "
                               f"{max(p.parallel)}")
        if d.own_gamma + 1 > N_BATCH:
            raise HarnessError(f"{d} drafts up to {d.own_gamma} tokens, verified in one batch of {N_BATCH} with the "
                               f"last: give it at most {N_BATCH - 1}")


def _check_engine(p: Params) -> None:
    """--engine server runs what llama-server has: its own types, fixed draft lengths, one request at a time, its
    own verification; what it lacks is refused in one line."""
    if p.engine not in ENGINES:
        raise HarnessError(f"--engine {p.engine}: give harness (the harness's own loop) or server (llama-server)")
    if p.engine != "server":
        for d in p.draft:
            if d.server_only:
                raise HarnessError(f"--draft {d}: llama-server's --spec-type {d.server_type} is measured in "
                                   "llama-server only: add --engine server")
        if p.llama_server and not p.server_check:
            raise HarnessError("--llama-server names the binary --engine server or --server-check runs: give one of "
                               "them with it")
        return
    for d in p.draft:
        if d.ngram:
            raise HarnessError(f"--engine server: {d} is the harness's own prompt lookup, which llama-server lacks; "
                               f"its closest type is ngram-simple:size-n={d.ngram}:size-m=GAMMA")
    for what, bad in (("adaptive gamma (auto)", any(g.adaptive for g in p.gamma)), ("--replay", p.replay),
                      ("--calibrate", p.calibrate), ("--prompt-cache", p.prompt_cache),
                      (f"--parallel {max(p.parallel)}", max(p.parallel) > 1),
                      (f"--verify {','.join(p.verify)}", p.verify != ["leviathan"]),
                      (f"--kv-unified {','.join(p.kv_unified)}", p.kv_unified != ["off"])):
        if bad:
            raise HarnessError(f"--engine server does not take {what}: llama-server runs fixed draft lengths, one "
                               "request at a time, verified its own way; sweep it with --engine harness")


def check_parallel(p: Params) -> None:
    if any(v < 1 for v in p.parallel):
        raise HarnessError(f"--parallel values must be >= 1 (requests decoded together), got {min(p.parallel)}")
    if max(p.parallel) == 1:
        return
    # the loop runs any of these at one slot; in a batch, a sequence's step costs what the others' blocks add
    for what, why, bad in (
            ("adaptive gamma (auto)", "prices one sequence's steps", any(g.adaptive for g in p.gamma)),
            ("--replay", "prices steps from one sequence's plain run", p.replay),
            ("--until-confident", "adds prompts one pair at a time, where a batch pairs a category's requests",
             p.until_confident)):
        if bad:
            raise HarnessError(f"--parallel above 1 does not combine with {what}, which {why}: sweep --parallel "
                               "with fixed gammas, timed")
    widest = max(p.parallel) * (max((g.n for g in p.gamma if not g.adaptive), default=0) + 1)
    if widest > N_BATCH:
        raise HarnessError(f"--parallel {max(p.parallel)} x (gamma + 1) = {widest} tokens per step exceed the batch "
                           f"size {N_BATCH}: lower --parallel or --gamma")


ENGINE_KEYS = ("cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft", "flash_attn", "ubatch")


def _as_list(key: str, v) -> list:
    items = v if isinstance(v, list) else [x.strip() for x in str(v).split(",") if x.strip()]
    if key in ("gamma", "draft"):
        return [(parse_gamma if key == "gamma" else parse_draft)(x) for x in items]
    default = getattr(Params(), key)
    conv = type(default[0]) if default else str  # each list's values are of its default's type
    try:
        if any(isinstance(x, (list, dict)) for x in items):
            raise ValueError
        return [conv(x) for x in items]
    except ValueError:
        raise HarnessError(f"--{key.replace('_', '-')}: cannot read {v!r} as a list of {conv.__name__}") from None


def _draftings(p: Params, draft: DraftSpec, greedy: bool) -> list[tuple[str, float, int]]:
    """(verify, p_min, n_min) for a draft: under greedy decoding both rules are one; a lookup has no
    probabilities to test against p-min and drops no short drafts."""
    out = []
    for v, pm, nm in itertools.product(p.verify, p.draft_p_min, p.draft_n_min):
        Drafting(v, pm, nm)  # refuses an unknown rule or a value out of range, in one line
        if greedy:
            v = "leviathan"
        if draft.model_free:
            pm, nm = 0.0, 0
        out.append((v, pm, nm))
    return list(dict.fromkeys(out))


def expand(p: Params) -> list[Instance]:
    """The instances of p's sweep, then of each of p.also's (p with those lists replaced), each once."""
    out = [i for q in [p, *(_also(p, a) for a in p.also)] for i in _expand(q)]
    return list({i.id: i for i in out}.values())


def _also(p: Params, extra: dict) -> Params:
    from dataclasses import replace
    if not isinstance(extra, dict) or not extra or set(extra) - set(LIST_KEYS):
        raise HarnessError(f"'also' takes tables of list options ({', '.join(LIST_KEYS)}) for a further sweep, "
                           f"got {extra!r}")
    return replace(p, also=[], **{k: _as_list(k, v) for k, v in extra.items()})


def _expand(p: Params) -> list[Instance]:
    gammas = [g.resolved([f.n for f in p.gamma if not f.adaptive]) for g in p.gamma]
    require_fits_batch(max((g.n for g in gammas), default=0))
    policies = [Policy(t, k, tp, mp, p.seed) for t, k, tp, mp in itertools.product(p.temp, p.top_k, p.top_p, p.min_p)]
    policies = list(dict.fromkeys(Policy(0.0, 0, 1.0, 0.0, p.seed) if x.greedy else x for x in policies))
    out: list[Instance] = []
    for target, ngl, threads, pol, *knobs in itertools.product(p.target, p.ngl, p.threads, policies, p.cache_type_k,
            p.cache_type_v, p.flash_attn, p.ubatch, p.parallel, p.kv_unified):
        ctx = dict(zip(("cache_k", "cache_v", "flash_attn", "ubatch", "parallel", "kv_unified"), knobs))
        ctx["kv_unified"] = ctx["kv_unified"] == "on" and ctx["parallel"] > 1  # one sequence: one buffer either way
        base = Instance(target, NoDraft(), 0, pol, ngl, 0, threads, **ctx)
        base.engine_config(p.n_ctx)  # refuses an unknown type or a quantized V cache without flash attention
        out.append(base)
        for draft, g, ngl_d, ckd, cvd in itertools.product(p.draft, gammas, p.ngl_draft, p.cache_type_k_draft,
                                                                     p.cache_type_v_draft):
            if draft.plain:
                continue
            if draft.model_free:  # a lookup has no KV cache of its own
                ckd, cvd = "f16", "f16"
            if draft.own_gamma:  # llama.cpp's n-gram types draft up to their own n-max (size-m), whatever the sweep's
                g = Gamma(draft.own_gamma)
            for v, pm, nm in _draftings(p, draft, pol.greedy):
                out.append(i := Instance(target, draft, g.n, pol, ngl, ngl_d, threads, g.adaptive, v, pm, nm,
                                         cache_k_draft=ckd, cache_v_draft=cvd, **ctx))
                i.draft_engine_config(p.n_ctx)
    out = list({i.id: i for i in out}.values())
    if not out:
        raise HarnessError("the sweep expands to no configuration")
    return out


def first_round(params: Params) -> list:
    """A new run's prompts: each category's first params.per_category (0: all)."""
    return load(params.categories or None, [Path(p) for p in params.prompts] or None, params.per_category,
                params.prompt_chars)


def prompt_pool(params: Params, categories: list[str] | None = None) -> list:
    """Every prompt the run may use, in each file's order: what --until-confident draws its next prompts from."""
    if params.prompts:
        return load(categories=params.categories or None, paths=[Path(p) for p in params.prompts],
                    chars=params.prompt_chars)
    return load(categories=categories or params.categories or None, chars=params.prompt_chars)
