"""What estimates start from (bench.estimate): each model's speed on this machine, probed in seconds (Probe),
kept for minutes (a dry run and then the run price the same figures), and each prompt's length in its target's
tokens (Figures)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CHUNK = 256  # tokens a probe evaluates as a prompt, twice: cached positions 0..CHUNK, then CHUNK..2 CHUNK
BLOCK = 8  # the verify-sized block a probe times (gamma 7): the step from one token to a block is linear
REPS = 3  # calibrate.in_situ's repetitions of each block
# A probe this recent, of the same file with the same settings, build and machine, is taken from the cache
# rather than timed again: a dry run and then the run, or a test suite's many short runs, where probing a small
# model (7 s on a slow Xeon VM) cost more than the run itself
PROBE_TTL_S = 600
# a model loaded with a 2048-token context, page cache warm, on the 2-core Xeon VM: 0.3 s (0.5B Q4_K_M and Q4_0,
# 1.5B F16) to 0.7 s (1.5B Q4_K_M, whose weights are repacked); a probe times its own
MODEL_S = 0.5


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
        """ms of a decode of k = 1..k_max tokens (all logits) after `context` cached. Beyond the sizes timed, each
        further token costs the step of the timed blocks, or where they were timed one by one, at most what a
        token costs in a prompt's batch: the small blocks' step does not go on (on the slower Xeon VM 46 ms
        against 18.5, and 8 sequences x 4 tokens took 700-740 ms in a batch, where the step priced 1,370 and the
        prompt's rate 700)."""
        extra = (0.0, *self.block_extra_ms)
        step = min(self.block_step_ms, self.prompt(1, context)) if self.block_extra_ms else self.block_step_ms
        return [self.decode(context) + (extra[k - 1] if k <= len(extra) else extra[-1] + (k - len(extra)) * step)
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
        for _ in range(REPS):
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
    prompt's length in its target's tokens (the chat template applied), per (target, prompt digest), from the
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
        key = (target, prompt.digest)  # a prompt shortened by the budget keeps its id
        if key not in self.lengths:
            if target not in self._vocabs:
                from harness.llamacpp import Vocab, load_model
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
