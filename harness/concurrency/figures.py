"""Figures of concurrent decoding per (configuration, category), from trace records alone: total decode
throughput, each sequence's, latency per request (mean, p95), acceptance per request, sequences in flight, the
target's KV cells in use at the peak, and the batched cost model's prediction beside the measured speedup.

Total throughput is tokens over the time spent in decode steps (prompts' prefill left out, as in tokens/s per
sequence); at N = 1 that is the sequential loop's own generation time. Latency runs from a request entering its
slot to its last token, its own prefill included."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

from harness.concurrency.costs import from_record, predicted_speedup, step_ms


def _by(records: list[dict], kind: str) -> dict[tuple, list[dict]]:
    out = defaultdict(list)
    for r in records:
        if r.get("type") == kind:
            out[(r.get("config"), r.get("category"), r.get("mode"))].append(r)
    return out


def _decode(gens: list[dict], batches: list[dict]) -> dict:
    """Throughput, latency and batch occupancy of one configuration's generations in one category."""
    if not gens:
        return {}
    tokens = sum(g["n_tokens"] for g in gens)
    ms = sum(b["decode_ms"] for b in batches) if batches else sum(g["gen_ms"] for g in gens)
    lat = np.array([g["latency_ms"] for g in gens])
    steps = sum(b["steps"] for b in batches)
    return {"total_tokens_per_s": tokens / ms * 1e3 if ms > 0 else None,
            "step_ms": ms / (steps or sum(g["steps"] for g in gens) or 1),
            "latency_ms": float(lat.mean()), "latency_p95_ms": float(np.quantile(lat, 0.95)),
            "mean_active": sum(b["mean_active"] * b["steps"] for b in batches) / steps if steps else 1.0,
            "peak_positions": max((b["peak_positions"] for b in batches),
                                  default=max(g["prompt_tokens"] + g["n_tokens"] for g in gens)),
            "requests": len(gens), "slots_used": max((b["slots_used"] for b in batches), default=1)}


def _step_overhead(steps: list[dict]) -> float:
    """Mean overhead per step of the whole batch (each sequence's record repeats its step's shared times)."""
    seen = {(s.get("repeat"), s["batch_step"]) if "batch_step" in s else (s.get("prompt_id"), s.get("repeat"),
                                                                          s["step"]): s["overhead_ms"] for s in steps}
    return float(np.mean(list(seen.values()))) if seen else 0.0


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
    costs = {r["config"]: r for r in records if r.get("type") == "costs"}
    rows = []
    for r in sweep.iter_rows(named=True):
        cfg, cat = r["config"], r["category"]
        spec = r["draft"] != "none"
        own = (cfg, cat, "speculative" if spec else "baseline")
        if spec and (cfg, cat, "baseline") in p_gens:
            ref, src = (cfg, cat, "baseline"), (p_gens, p_batches, p_steps)
        else:
            ref, src = (base_of.get(cfg), cat, "baseline"), (gens, batches, steps)
        mine, plain = _decode(gens[own], batches[own]), _decode(src[0][ref], src[1][ref])
        out = {"config": cfg, "category": cat, **{k: mine.get(k) for k in (
            "total_tokens_per_s", "latency_ms", "latency_p95_ms", "mean_active", "peak_positions", "requests",
            "slots_used")}} | {f"plain_{k}": plain.get(k) for k in ("total_tokens_per_s", "latency_ms",
                                                                     "latency_p95_ms", "mean_active")}
        lo, hi = _per_request_acceptance(steps[own]) if spec else (None, None)
        out |= {"acceptance_min": lo, "acceptance_max": hi, "predicted": None, "predicted_step_ms": None,
                "step_ms": mine.get("step_ms"), "plain_step_ms": plain.get("step_ms")}
        if spec and cfg in costs and r["alpha"] is not None and mine and plain:
            c = from_record(costs[cfg], r["context"], r["gamma"], r["parallel"])
            share = r["verify_steps"] / r["target_calls"] if r["target_calls"] else 1.0
            oh = _step_overhead(steps[own])
            out["predicted"] = predicted_speedup(r["alpha"], r["gamma"], c, mine["mean_active"], plain["step_ms"],
                                                 oh, share)
            out["predicted_step_ms"] = step_ms(c, mine["mean_active"], r["gamma"], oh, share)
        rows.append(out)
    return pl.DataFrame(rows, infer_schema_length=None)
