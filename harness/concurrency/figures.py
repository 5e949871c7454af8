"""Figures of concurrent decoding per (configuration, category), from trace records alone: total decode
throughput, each sequence's, latency per request (mean, p95), acceptance per request, sequences in flight, the
target's KV cells in use at the peak, and the batched cost model's prediction beside the measured speedup: a
batched run's steps priced in the shapes their records show (costmodel.price).

Total throughput is tokens over the time spent in decode steps (prompts' prefill left out, as in tokens/s per
sequence); at N = 1 that is the sequential loop's own generation time. Latency runs from a request entering its
slot to its last token, its own prefill included."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import polars as pl

from harness.costmodel import BatchCosts, Shape, predicted_speedup, price, read


def _by(records: list[dict], kind: str) -> dict[tuple, list[dict]]:
    out = defaultdict(list)
    for r in records:
        if r.get("type") == kind:
            out[(r.get("config"), r.get("category"), r.get("mode"))].append(r)
    return out


def _batched(steps: list[dict]) -> list[list[dict]] | None:
    """Each batched step's records, in batch order, the steps in order (None for a sequential run's records)."""
    by_step = defaultdict(list)
    for s in steps:
        if "batch_step" not in s:
            return None
        by_step[(s.get("repeat") or 0, s["batch_step"])].append(s)  # a step's records come in batch order
    return [by_step[k] for k in sorted(by_step)]


def _per_sequence(groups: list[list[dict]], prices: list[float]) -> float:
    """The mean step a request waits through: each step weighted by the sequences in it (a full batch's steps
    are the longest and hold the most requests)."""
    return sum(len(g) * p for g, p in zip(groups, prices)) / sum(len(g) for g in groups)


def _took(g: list[dict]) -> float:
    return g[0]["draft_ms"] + g[0]["verify_ms"] + g[0]["overhead_ms"]  # each record repeats its step's times


def _decode(gens: list[dict], batches: list[dict], steps: list[dict]) -> dict:
    """Throughput, latency and batch occupancy of one configuration's generations in one category; step_ms: the
    mean step a request waits through."""
    if not gens:
        return {}
    tokens = sum(g["n_tokens"] for g in gens)
    ms = sum(b["decode_ms"] for b in batches) if batches else sum(g["gen_ms"] for g in gens)
    lat = np.array([g["latency_ms"] for g in gens])
    n_steps, groups = sum(b["steps"] for b in batches), _batched(steps)
    return {"total_tokens_per_s": tokens / ms * 1e3 if ms > 0 else None,
            "step_ms": _per_sequence(groups, [_took(g) for g in groups]) if groups else
            ms / (n_steps or sum(g["steps"] for g in gens) or 1),
            "latency_ms": float(lat.mean()), "latency_p95_ms": float(np.quantile(lat, 0.95)),
            "mean_active": sum(b["mean_active"] * b["steps"] for b in batches) / n_steps if n_steps else 1.0,
            "peak_positions": max((b["peak_positions"] for b in batches),
                                  default=max(g["prompt_tokens"] + g["n_tokens"] for g in gens)),
            "requests": len(gens), "slots_used": max((b["slots_used"] for b in batches), default=1)}


def _overhead_per_row(steps: list[dict]) -> float:
    """The loop's overhead per verified row, as the cost model charges it (price.price): each step's overhead
    counted once (each sequence's record repeats its step's shared times), over the rows its sequences verified."""
    oh, rows = {}, defaultdict(int)
    for s in steps:
        key = (s.get("repeat"), s["batch_step"]) if "batch_step" in s else (s.get("prompt_id"), s.get("repeat"),
                                                                             s["step"])
        oh[key] = s["overhead_ms"]
        rows[key] += s["proposed"] + 1
    return sum(oh.values()) / sum(rows.values()) if oh else 0.0


def _fed(step: dict) -> int:
    """Drafts the draft model decoded back in a step: each but the last of a full-length draft."""
    return min(step["proposed"], max(step["gamma"] - 1, 0))


def shaped_prices(costs: BatchCosts, groups: list[list[dict]], unified: bool, n_ubatch: int = 512) -> list[float]:
    """Each batched step as it ran, priced, its overhead as measured (the step's own, not the model's); each
    sequence's shapes replayed from its
    records: its block, the draft's catch-up (two tokens after a step that accepted every draft fed back, one
    else: the bonus token the draft never saw) and the drafts fed back (all but the last). A draft dropped for
    --draft-n-min records none, so its decodes go unpriced."""
    prev: dict[tuple, dict] = {}
    prices = []
    for recs in groups:
        catch_up = []
        for s in recs:
            key = (s.get("repeat") or 0, s.get("prompt_id"))
            last = prev.get(key)
            catch_up.append(0 if s["gamma"] == 0 else max(1, last["emitted"] - _fed(last)) if last else 1)
            prev[key] = s
        shape = Shape(tuple(1 + s["proposed"] for s in recs), tuple(catch_up), tuple(_fed(s) for s in recs),
                      seqs=tuple(s["seq"] for s in recs))
        prices.append(recs[0]["overhead_ms"] + price(shape, costs, unified, n_ubatch))
    return prices


def _per_request_acceptance(steps: list[dict]) -> tuple[float | None, float | None]:
    acc, prop = defaultdict(int), defaultdict(int)
    for s in steps:
        acc[s.get("prompt_id")] += s["accepted"]
        prop[s.get("prompt_id")] += s["proposed"]
    rates = [acc[k] / prop[k] for k in prop if prop[k]]
    return (min(rates), max(rates)) if rates else (None, None)


def concurrency_frame(sweep: pl.DataFrame, records: list[dict], paired: list[dict],
                      base_of: dict[str, str]) -> pl.DataFrame | None:
    """A row per (configuration, category) of a run that decoded several requests together (None otherwise):
    the configuration's figures beside its plain reference at the same N (its paired twins, else the plain
    baseline configuration)."""
    if "parallel" not in sweep.columns or (sweep["parallel"].max() or 1) <= 1:
        return None
    gens, batches, steps = _by(records, "generation"), _by(records, "batch"), _by(records, "step")
    p_gens, p_batches, p_steps = _by(paired, "generation"), _by(paired, "batch"), _by(paired, "step")
    from harness.calibrate import unit_costs
    costs = unit_costs(records)
    rows = []
    for r in sweep.iter_rows(named=True):
        cfg, cat = r["config"], r["category"]
        spec = r["draft"] != "none"
        own = (cfg, cat, "speculative" if spec else "baseline")
        if spec and (cfg, cat, "baseline") in p_gens:
            ref, src = (cfg, cat, "baseline"), (p_gens, p_batches, p_steps)
        else:
            ref, src = (base_of.get(cfg), cat, "baseline"), (gens, batches, steps)
        mine, plain = _decode(gens[own], batches[own], steps[own]), _decode(*(x[ref] for x in src))
        base = (base_of.get(cfg), cat, "baseline")  # the same plain requests again, in another worker
        again = _decode(gens[base], batches[base], steps[base]) if spec and ref != base else {}
        out = {"config": cfg, "category": cat, **{k: mine.get(k) for k in (
            "total_tokens_per_s", "latency_ms", "latency_p95_ms", "mean_active", "peak_positions", "requests",
            "slots_used")}} | {f"plain_{k}": plain.get(k) for k in ("total_tokens_per_s", "latency_ms",
                                                                     "latency_p95_ms", "mean_active")}
        lo, hi = _per_request_acceptance(steps[own]) if spec else (None, None)
        out |= {"acceptance_min": lo, "acceptance_max": hi, "predicted": None, "predicted_step_ms": None,
                "step_ms": mine.get("step_ms"), "plain_step_ms": plain.get("step_ms"),
                "base_step_ms": again.get("step_ms")}
        if spec and cfg in costs and r["alpha"] is not None and mine and plain:
            c = read(costs[cfg]).batch(r["context"], r["gamma"], r["parallel"])
            share = r["verify_steps"] / r["target_calls"] if r["target_calls"] else 1.0
            groups = _batched(steps[own])
            pred = _per_sequence(groups, shaped_prices(c, groups, bool(r.get("kv_unified")), r.get("ubatch") or 512)) \
                if groups else replace(c, overhead_ms_per_row=_overhead_per_row(steps[own])).step_ms(
                r["gamma"], share=share, n=mine["mean_active"])
            out["predicted"] = predicted_speedup(r["alpha"], r["gamma"], c, share, plain["step_ms"], pred)
            out["predicted_step_ms"] = pred
        rows.append(out)
    return pl.DataFrame(rows, infer_schema_length=None)


def gap(a: float, b: float) -> float:
    """How far apart two positive figures are, as a fraction of the smaller."""
    return max(a, b) / min(a, b) - 1


def agreement(rows: list[dict], tol: float = 0.1) -> dict:
    """Over a run's speculative rows: the prediction against the measured speedup, and the timing floor, the
    same plain work timed twice (each row's plain twins against the plain baseline configuration's run of the
    same requests at the same N): how many agree within tol, of how many, and the largest gap."""
    pred = [gap(r["predicted"], r["speedup"]) for r in rows if r.get("predicted") and r.get("speedup")]
    twice = [gap(r["plain_step_ms"], r["base_step_ms"]) for r in rows
             if r.get("plain_step_ms") and r.get("base_step_ms")]
    return {"predicted": sum(g <= tol for g in pred), "predicted_of": len(pred),
            "twice": sum(g <= tol for g in twice), "twice_of": len(twice), "twice_max": max(twice, default=None)}
