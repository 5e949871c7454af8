"""A run's configurations as a frame (one row per instance of its plan, with what its worker reported: status,
memory by llama.cpp's buffers) and its units'."""
from __future__ import annotations

import polars as pl

from harness.instance import Instance


def config_frame(plan: dict, results: dict[str, dict]) -> pl.DataFrame:
    rows = []
    for d in plan["instances"]:
        inst = Instance.from_dict(d)
        res = results.get(inst.id, {})
        # a llama-server unit's (bench.serverunit) peak RSS would be the harness's, not the server's: unknown
        rss = None if res.get("llama_server") else res.get("peak_rss_bytes")
        rows.append({"config": inst.id, "target": inst.target, "setup": inst.setup, "cache_k": inst.cache_k,
                     "cache_v": inst.cache_v, "flash_attn": inst.flash_attn, "ubatch": inst.ubatch,
                     "draft": str(inst.draft), "draft_label": inst.draft_label,
                     "verify": inst.verify, "p_min": inst.p_min, "n_min": inst.n_min, "gamma": inst.gamma,
                     "adaptive": inst.adaptive, "gamma_label": inst.gamma_label,
                     "policy": inst.policy.label, "ngl": inst.ngl, "ngl_draft": inst.ngl_draft,
                     "threads": inst.threads, "parallel": inst.parallel, "kv_unified": inst.kv_unified,
                     "status": res.get("status", "not run"),
                     "error": res.get("error", ""), "peak_rss_bytes": rss,
                     "kv_bytes": res.get("kv_bytes"), "kv_bytes_per_position": res.get("kv_bytes_per_position"),
                     "target_bytes": res.get("target_bytes"),
                     "draft_bytes": res.get("draft_bytes"),
                     "llama_server_version": res.get("llama_server_version")} | memory_columns(res))
    return pl.DataFrame(rows, infer_schema_length=None)


def memory_columns(res: dict) -> dict:
    """llama.cpp's buffers of a configuration's worker, both models summed, on the host and on devices: weights,
    KV cache, compute (logits output included); the devices' names; what flash attention resolved to."""
    from harness.llamacpp import on_host
    mem = res.get("memory")
    out = {f"{where}_{kind}_bytes": None if mem is None else 0 for where in ("host", "device")
           for kind in ("model", "kv", "compute")}
    devices, weights = set(), {}
    for b in mem or []:
        where = "host" if on_host(b["buffer"]) else "device"
        if where == "device":
            devices.add(b["buffer"])
        kind = {"output": "compute", "rs": "kv"}.get(b["kind"], b["kind"])
        out[f"{where}_{kind}_bytes"] += b["bytes"]
        if kind == "model":
            w = weights.setdefault(b.get("model", "target"), {})
            w[b["buffer"]] = w.get(b["buffer"], 0) + b["bytes"]
    # what the worker's engines resolved flash attention to; a row that never ran (skipped, an error) carries only
    # the setting asked for, a string
    fa = res.get("flash_attn") if isinstance(res.get("flash_attn"), dict) else {}
    # weights by buffer type: mapped from the file, and copies llama.cpp repacks for its CPU kernels (CPU_REPACK)
    by_buffer = {f"{role}_weights": " + ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(weights.get(role, {})
                                                                                               .items())) or None
                 for role in ("target", "draft")}
    return out | by_buffer | {"rss_before_models": res.get("rss_before_models"),
                  "devices": ", ".join(sorted(devices)) if mem is not None else None,
                  "flash_attn_used": None if not fa else all(v for v in fa.values() if v is not None)}


def units_frame(results: dict[str, dict]) -> pl.DataFrame:
    """Every unit of work recorded: its configuration, round, status and error."""
    rows = [{"unit": u, "config": r["config"], "round": r.get("round", 0), "status": r.get("status"),
             "error": r.get("error", ""), "wall_s": r.get("wall_s")} for u, r in results.items()]
    return pl.DataFrame(rows, schema={"unit": pl.String, "config": pl.String, "round": pl.Int64,
                                      "status": pl.String, "error": pl.String, "wall_s": pl.Float64})
