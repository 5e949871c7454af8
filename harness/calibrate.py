"""The cost of llama_decode for k = 1..k_max tokens with all logits: what the cost model is built from."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from harness.engine import Engine, EngineConfig
from harness.errors import HarnessError
from harness.gamma import N_BATCH
from harness.models.catalog import require_present, resolve
from harness.sysinfo import collect, header

CAL_DIR = Path("reports/calibration")
# Tokens already in the cache while timing: a verify at a long prompt's end costs more than at a short one's,
# so costs are measured at both ends of what the prompt sets hold and interpolated in between.
CONTEXTS = (128, 1024)


def cal_path(model_name: str, threads: int, ngl: int, root: Path = CAL_DIR) -> Path:
    return root / f"{model_name}-t{threads}-ngl{ngl}.json"


def block_times(e: Engine, n_keep: int, block: list[int], k_max: int, reps: int, logits: str,
                ks: list[int] | None = None) -> list[list[float]]:
    """ms of decoding block[:k] after n_keep cached tokens, reps times for each k in ks (default 1..k_max), the k
    interleaved within each repetition so that a slow spell of the machine does not land on one k."""
    ks = ks or list(range(1, k_max + 1))
    times: list[list[float]] = [[] for _ in ks]
    for _ in range(reps):
        for i, k in enumerate(ks):
            e.trim(n_keep)
            t = time.perf_counter()
            e.decode(block[:k], logits=logits)
            times[i].append((time.perf_counter() - t) * 1000)
    e.trim(n_keep)
    return times


DENSE_K = 8  # block sizes timed one by one; beyond, doubling to k_max


def block_sizes(k_max: int) -> list[int]:
    """The block sizes in_situ times: every k up to DENSE_K, then doubling, then k_max itself; summarized
    interpolates the rest. Timing every k up to llama.cpp's ngram-mod's 65 (n-max 64, and the bonus token) held a
    2-core VM about 12 minutes before a worker's first prompt; past a few tokens a block's cost grows close to
    linearly in k. A doubling that would leave less than its own step to k_max gives way to k_max."""
    ks = list(range(1, min(k_max, DENSE_K) + 1))
    while ks[-1] < k_max:
        ks.append(ks[-1] * 2 if ks[-1] * 3 <= k_max else k_max)
    return ks


def summary(times: list[list[float]]) -> tuple[list[float], list[float]]:
    """Each k's median, and its repetitions' spread (their standard deviation; 0 from one), which says how far
    each median could be off."""
    return [statistics.median(t) for t in times], [statistics.stdev(t) if len(t) > 1 else 0.0 for t in times]


def time_blocks(e: Engine, n_keep: int, block: list[int], k_max: int, reps: int,
                logits: str) -> tuple[list[float], list[float]]:
    """Median ms of decoding block[:k] after n_keep cached tokens, k = 1..k_max, and each median's spread."""
    return summary(block_times(e, n_keep, block, k_max, reps, logits))


def check_args(k_max: int, reps: int) -> None:
    """Refuse, before any model loads, what cannot be measured: a block of k tokens decodes in one batch."""
    if k_max < 1 or reps < 1:
        raise HarnessError("--k-max and --reps must be >= 1")
    if k_max > N_BATCH:
        raise HarnessError(f"--k-max {k_max} exceeds the batch size {N_BATCH} (a block of k tokens decodes in one "
                           f"batch): give --k-max {N_BATCH} or less")


def calibrate(model_ref: str, threads: int = 0, ngl: int = 0, k_max: int = 16, reps: int = 5) -> dict:
    """Decode costs of k = 1..k_max tokens at each of CONTEXTS cached tokens: with all logits (a verification
    block: the target's cost) and with the last row's only (how a draft decodes, catching up included: the
    output projection of a 150k vocabulary is much of a small model's cost, so the two differ)."""
    check_args(k_max, reps)
    m = resolve(model_ref)
    require_present(m)
    cfg = EngineConfig(n_ctx=CONTEXTS[-1] + k_max + 8, n_batch=512, n_gpu_layers=ngl, threads=threads)
    by_context, last_by_context, sd, last_sd = [], [], [], []
    with Engine(m.path, cfg) as e:
        filler = e.vocab.tokenize("The quick brown fox jumps over the lazy dog. " * 120, add_special=False)
        block = filler[:k_max]
        for ctx in CONTEXTS:
            e.reset()
            e.decode(filler[:ctx], logits="none")
            e.decode(block[:4], logits="all")  # warm-up
            for ms, spread, logits in ((by_context, sd, "all"), (last_by_context, last_sd, "last")):
                med, dev = time_blocks(e, ctx, block, k_max, reps, logits)
                ms.append(med)
                spread.append(dev)
    return {"model": m.name, "path": str(m.path), "threads": cfg.resolved_threads(), "ngl": ngl,
            "contexts": list(CONTEXTS), "k": list(range(1, k_max + 1)), "ms_by_context": by_context,
            "ms_last_by_context": last_by_context, "ms": by_context[0], "reps": reps,
            "ms_sd_by_context": sd, "ms_last_sd_by_context": last_sd,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "taken": time.time(), "sha256": _sha256(m),
            "machine": header(collect())}  # portable: `harness predict` puts another machine's run beside it


def _sha256(m) -> str:
    from harness.models.store import read_sidecar
    return read_sidecar(m.path).get("sha256") or m.sha256 or ""


def spanned_contexts(prompt_lens: list[int], ends: list[int], k_max: int) -> tuple[int, ...]:
    """Where a unit's rows decode: from its shortest prompt to its longest generation's end. Costs measured
    there are interpolated, never extrapolated, and a unit of short prompts does not pay a long prefill."""
    lo = max(min(prompt_lens), k_max)
    hi = max(max(ends), lo)
    return (lo,) if hi - lo < 16 else (lo, hi)


def in_situ(target: Engine | None, draft: Engine | None, text: list[int], k_max: int,
            contexts: tuple[int, ...], reps: int = 3, cache=None, prefixes: list[list[int]] = ()) -> dict:
    """The decode costs a worker's rows will pay, measured in the worker before them (and after: pooled): the target's
    verification blocks (all logits) and the draft's decodes (last logits) of k = 1..k_max tokens, after each
    of `contexts` cached tokens of real prompt text (interpolated to each row's own context), with each median's
    repetitions' spread ("*_sd_by_context", with "reps") and the repetitions ("*_times_by_context"). A
    calibration taken minutes earlier can be stale: on a 2-core VM the batched decodes slowed by 13% relative to
    single-token ones between the run's calibration and its sweep. cache, prefixes: the run's prompt cache and
    the prompts as the rows evaluate them through it (promptcache), from which each context starts (fill)."""
    engines = [e for e in (target, draft) if e is not None]
    room = min(e.n_ctx for e in engines) - k_max - 2
    ctxs = [c for c in contexts if c <= room] or [room]
    filler = (text * (ctxs[-1] // max(len(text), 1) + 1))[:ctxs[-1]]
    ks = block_sizes(k_max)
    out = {"type": "costs", "contexts": ctxs, "k": k_max, "ks": ks, "reps": reps}
    for role, e, logits in (("target", target, "all"), ("draft", draft, "last")):
        if e is None:
            continue
        out[f"{role}_times_by_context"] = []
        for c in ctxs:
            fill(e, filler[:c], cache, prefixes)
            out[f"{role}_times_by_context"].append(
                [[round(x, 3) for x in t] for t in block_times(e, c, filler[c - k_max:c], k_max, reps, logits, ks)])
        e.reset()
    return summarized(out)


def fill(e: Engine, tokens: list[int], cache=None, prefixes: list[list[int]] = ()) -> None:
    """len(tokens) tokens into e's emptied KV, no logits. With the run's prompt cache, the longest of `prefixes`
    that fits is restored (or evaluated and saved, which the generation's own evaluation of it then restores)
    and only the rest decoded: evaluating a long context afresh, before the rows and after them, cost a timed
    unit more than its generations on an Intel Xeon VM. Which tokens fill the KV does not change what a decode
    after them costs."""
    e.reset()
    start = max((p for p in prefixes if len(p) <= len(tokens)), key=len, default=[]) if cache is not None else []
    if start:
        cache.evaluate(e, start)
    if len(tokens) > len(start):
        e.decode(tokens[len(start):], logits="none")


def summarized(rec: dict) -> dict:
    """A costs record with each role's medians and spreads ("*_ms_by_context", "*_sd_by_context", k = 1..k each)
    from its repetitions ("*_times_by_context", one per k of "ks": linear between them), so that every reader
    of the medians sees every k. A record without "ks" timed every k."""
    out = dict(rec)
    ks = rec.get("ks")
    for role in ("target", "draft"):
        if f"{role}_times_by_context" in rec:
            sums = [summary(ts) for ts in rec[f"{role}_times_by_context"]]
            out[f"{role}_ms_by_context"] = [_every_k(ks, m) for m, _ in sums]
            out[f"{role}_sd_by_context"] = [_every_k(ks, s) for _, s in sums]
    return out


def _every_k(ks: list[int] | None, values: list[float]) -> list[float]:
    """values at block sizes ks, at k = 1..max(ks), rounded as records keep them."""
    if ks:
        values = np.interp(np.arange(1, ks[-1] + 1), ks, values).tolist()
    return [round(x, 3) for x in values]


def pooled(first: dict, second: dict) -> dict:
    """Two costs records of the same contexts and k, measured apart in time, as one: their repetitions together,
    so that the medians sit between the two moments and the spreads take in the machine's drift between them. A
    batched record (concurrency.calibrate, medians only): the mean of the two medians."""
    moments = {"moments": first.get("moments", 1) + second.get("moments", 1)}
    if "seqs" in first:
        return second | moments | {k: [round((a + b) / 2, 3) for a, b in zip(first[k], second[k])]
                                   for k in ("plain_ms", "verify_ms", "draft_ms", "draft_catch_up_ms")
                                   if first.get(k) and second.get(k)}
    out = dict(second) | moments | {"reps": first["reps"] + second["reps"]}
    for role in ("target", "draft"):
        key = f"{role}_times_by_context"
        if key in first and key in second:
            out[key] = [[a + b for a, b in zip(ka, kb)] for ka, kb in zip(first[key], second[key])]
    return summarized(out)


def moved(rec: dict) -> list[float] | None:
    """How far each of the target's blocks moved between a replay's costs record's two moments (pooled: the
    first half of each k's repetitions, then the second; the replay has pooled every record that keeps its
    repetitions, including those from before "moments" was recorded): the second's median over the first's,
    less 1, per context and k. None for a record without repetitions."""
    times = rec.get("target_times_by_context")
    if not times:
        return None
    half = rec["reps"] // 2
    return [statistics.median(t[half:]) / statistics.median(t[:half]) - 1 for ctx in times for t in ctx
            if half and len(t) > half]


def unit_costs(records: list[dict]) -> dict[str, dict]:
    """{configuration: its worker's costs}: measured before its generations and, since the pooling, after them
    too (bench.worker), the first and last pooled; a record measured once stands as it is."""
    by: dict[str, list[dict]] = {}
    for r in records:
        if r.get("type") == "costs" and "proposer" not in r:  # the replay's carry their proposer
            by.setdefault(r["config"], []).append(r)
    return {c: rs[0] if len(rs) == 1 or not _poolable(rs[0], rs[-1]) else pooled(rs[0], rs[-1])
            for c, rs in by.items()}


def _poolable(a: dict, b: dict) -> bool:
    """Two records of one kind and shape: batched, or with their repetitions kept at the same contexts."""
    if "seqs" in a or "seqs" in b:
        return a.get("seqs") == b.get("seqs")
    return "target_times_by_context" in a and "target_times_by_context" in b and a["contexts"] == b["contexts"] \
        and a.get("ks") == b.get("ks")


def save(cal: dict, root: Path = CAL_DIR) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    p = cal_path(cal["model"], cal["threads"], cal["ngl"], root)
    p.write_text(json.dumps(cal, indent=1))
    return p


def load(model_name: str, threads: int, ngl: int, root: Path = CAL_DIR) -> dict | None:
    p = cal_path(model_name, threads, ngl, root)
    return json.loads(p.read_text()) if p.exists() else None


def costs_at(cal_dir: Path, target: str, draft: str | None, threads: int, ngl: int, ngl_draft: int,
             context: float, overhead_ms_per_row: float = 0.0):
    """costmodel.Costs from the calibrations in cal_dir at `context` cached tokens; draft None is a proposer
    without a model (n-gram). None when a needed calibration is missing."""
    from harness.costmodel import calibrated
    t = load(target, threads, ngl, cal_dir)
    d = load(draft, threads, ngl_draft, cal_dir) if draft else None
    if t is None or (draft and d is None):
        return None
    return calibrated(t, d).costs(context, overhead_ms_per_row)


def table_rows(cal: dict) -> list[list]:
    """k, then ms, ms per token and cost against k=1 at each measured context."""
    rows = []
    for i, k in enumerate(cal["k"]):
        row = [k]
        for ms in cal["ms_by_context"]:
            row += [f"{ms[i]:.1f}", f"{ms[i] / k:.1f}", f"{ms[i] / ms[0]:.2f}x"]
        rows.append(row)
    return rows


def table_headers(cal: dict) -> list[str]:
    return ["k"] + [h for c in cal["contexts"] for h in (f"ms @{c}", f"ms/token @{c}", f"vs k=1 @{c}")]
