"""Confidence intervals of a row's figures (speedup, acceptance rate, mean accepted length, alpha) from its
traces alone: a two-stage bootstrap, over prompts and, within each prompt's generations, over verification
steps, keeping every speculative generation with its plain twin. Seeded per row, so a report regenerates
identically.

The figures are ratios of sums over steps (tokens over milliseconds, accepted over proposed, ...), so a
replicate is the same ratio of reweighted sums. The interval is a t interval around the row's own figure with
the bootstrap's standard error (log scale for the speedup) and n - 1 degrees of freedom for n prompts: a
percentile bootstrap over a handful of prompts covers far less than 95%. The second stage counts the
step-to-step variation a second time (it is already in how prompts differ), which about offsets the first
stage's (n - 1) / n shortfall: on synthetic traces with a known speedup, 3 to 20 prompts, the interval covered
it 90-98.5% of the time, and more (up to 99.5%) where prompts barely differ. One prompt says nothing of how
prompts differ: its interval covers the step-to-step variation only (normal quantile), and verdicts treat it
so."""
from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

# Per step: the sums every figure is a ratio of.
FIELDS = ("spec_tokens", "spec_ms", "plain_tokens", "plain_ms", "accepted", "proposed", "vsteps", "alpha_sum",
          "alpha_n")
REPLICATES = 2000
LEVEL = 0.95


@dataclass
class Generation:
    """One speculative generation and its plain twin, as per-step arrays (their times scaled so that they add up
    to the measured generation times: the loop's bookkeeping between steps is in those, not in the steps)."""
    spec: np.ndarray   # [steps, FIELDS] of the speculative generation (plain_* columns zero)
    plain: np.ndarray  # [steps, FIELDS] of the plain twin (only plain_* columns)


@dataclass
class Row:
    prompts: list[list[Generation]] = field(default_factory=list)  # per prompt, its generations (repeats)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with integer df > 0, by bisection on its exact CDF (Abramowitz & Stegun 26.7.3-4)."""
    if df <= 0:
        raise ValueError("df must be positive")

    def cdf(t: float) -> float:
        th = math.atan(abs(t) / math.sqrt(df))
        c2, s = math.cos(th) ** 2, math.sin(th)
        if df % 2:  # odd
            term, acc = 1.0, 1.0 if df > 1 else 0.0
            for k in range(1, (df - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                acc += term
            a = 2 / math.pi * (th + (s * math.cos(th) * acc if df > 1 else 0.0))
        else:
            term, acc = 1.0, 1.0
            for k in range(1, df // 2):
                term *= c2 * (2 * k - 1) / (2 * k)
                acc += term
            a = s * acc
        return 0.5 + math.copysign(a / 2, t)

    lo, hi = -1e6, 1e6
    for _ in range(80):
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def step_matrix(emitted, step_ms, accepted, proposed, reached_alpha_sum, reached_n, gen_ms: float,
                spec: bool) -> np.ndarray:
    """A generation's steps as rows of FIELDS; times scaled to add up to gen_ms."""
    emitted, step_ms = np.asarray(emitted, float), np.asarray(step_ms, float)
    total = step_ms.sum()
    ms = step_ms * (gen_ms / total) if total > 0 else np.full(len(step_ms), gen_ms / max(len(step_ms), 1))
    m = np.zeros((len(emitted), len(FIELDS)))
    if spec:
        proposed = np.asarray(proposed, float)
        m[:, 0], m[:, 1] = emitted, ms
        m[:, 4], m[:, 5], m[:, 6] = accepted, proposed, proposed > 0
        m[:, 7], m[:, 8] = reached_alpha_sum, reached_n
    else:
        m[:, 2], m[:, 3] = emitted, ms
    return m


def figures(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The row's figures from summed FIELDS (last axis); NaN where undefined."""
    s = {k: sums[..., i] for i, k in enumerate(FIELDS)}
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"speedup": (s["spec_tokens"] / s["spec_ms"]) / (s["plain_tokens"] / s["plain_ms"]),
                "acceptance_rate": s["accepted"] / s["proposed"],
                "mean_accepted_len": s["accepted"] / s["vsteps"],
                "alpha": s["alpha_sum"] / s["alpha_n"]}


def _resampled_sums(row: Row, rng: np.random.Generator, reps: int) -> np.ndarray:
    """[reps, FIELDS]: prompts drawn with replacement; each drawn prompt's generations with their steps drawn
    with replacement (afresh for every draw of the prompt)."""
    n = len(row.prompts)
    pick = rng.integers(0, n, size=(reps, n)) if n > 1 else np.zeros((reps, 1), dtype=int)
    out = np.zeros((reps, len(FIELDS)))
    for slot in range(pick.shape[1]):
        for k, gens in enumerate(row.prompts):
            who = np.flatnonzero(pick[:, slot] == k)
            if not len(who):
                continue
            for g in gens:
                for m in (g.spec, g.plain):
                    if not len(m):
                        continue
                    counts = rng.multinomial(len(m), np.full(len(m), 1 / len(m)), size=len(who))
                    out[who] += counts @ m
    return out


def _seed(key: str) -> int:
    return zlib.crc32(key.encode())


def row_intervals(row: Row, key: str, reps: int = REPLICATES, level: float = LEVEL) -> dict:
    """Each figure with (lo, hi) at `level`, its bootstrap standard error and the number of prompts:
    {"speedup": x, "speedup_lo": ..., "speedup_hi": ..., "speedup_se": ... (log scale), ..., "prompts": n}."""
    return sums_intervals(row_sums(row, key, reps), level)


def row_sums(row: Row, key: str, reps: int = REPLICATES) -> tuple[np.ndarray, np.ndarray, int]:
    """A row's summed FIELDS, its bootstrap replicates' sums [reps, FIELDS] (seeded by key) and its prompts."""
    total = sum(m.sum(axis=0) for gens in row.prompts for g in gens for m in (g.spec, g.plain) if len(m))
    return np.asarray(total, float), _resampled_sums(row, np.random.default_rng(_seed(key)), reps), len(row.prompts)


def pooled_sums(parts: list[tuple[np.ndarray, np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows over disjoint prompt sets (a run's categories) as one: their sums and replicates added, a bootstrap
    stratified by part (each part's prompts resampled among themselves, as the run's mix of them is fixed)."""
    return sum(t for t, _, _ in parts), sum(b for _, b, _ in parts), sum(n for _, _, n in parts)


def sums_intervals(sums: tuple[np.ndarray, np.ndarray, int], level: float = LEVEL) -> dict:
    """row_intervals' figures from row_sums (or pooled_sums)."""
    total, resampled, n = sums
    est, boot = figures(total), figures(resampled)
    out = {"prompts": n}
    for name, x in est.items():
        x = float(x)
        b = boot[name][np.isfinite(boot[name])]
        if not np.isfinite(x) or len(b) < 2:
            out |= {name: None if not np.isfinite(x) else x, f"{name}_lo": None, f"{name}_hi": None,
                    f"{name}_se": None}
            continue
        log = name == "speedup"
        se = float(np.std(np.log(b) if log else b, ddof=1))
        lo, hi = interval(x, se, n, level, log)
        if not log:  # rates in [0, 1]; the mean accepted length is only bounded below
            lo, hi = max(lo, 0.0), (min(hi, 1.0) if name != "mean_accepted_len" else hi)
        out |= {name: x, f"{name}_lo": lo, f"{name}_hi": hi, f"{name}_se": se}
    return out


def widened(iv: dict, sd: float) -> dict:
    """A row's intervals with a further spread of the log speedup (the decode costs', the machine's pace) added
    to the bootstrap's, in quadrature."""
    if iv["speedup_se"] is None or not sd:
        return iv
    se = math.hypot(iv["speedup_se"], sd)
    lo, hi = interval(iv["speedup"], se, iv["prompts"], log=True)
    return iv | {"speedup_se": se, "speedup_lo": lo, "speedup_hi": hi}


def quantile(n: int, level: float) -> float:
    """t with n - 1 degrees of freedom for n >= 2 prompts; the normal quantile for one."""
    p = 1 - (1 - level) / 2
    return t_quantile(p, n - 1) if n > 1 else NormalDist().inv_cdf(p)


def interval(x: float, se: float, n: int, level: float = LEVEL, log: bool = False) -> tuple[float, float]:
    h = quantile(n, level) * se
    return (x * math.exp(-h), x * math.exp(h)) if log else (x - h, x + h)
