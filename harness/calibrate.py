"""The cost of llama_decode for k = 1..k_max tokens with all logits: what the cost model is built from."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from harness.engine import Engine, EngineConfig
from harness.errors import HarnessError
from harness.models.catalog import require_present, resolve

CAL_DIR = Path("reports/calibration")
CONTEXT = 128  # tokens already in the cache while timing, as in a real step


def cal_path(model_name: str, threads: int, ngl: int, root: Path = CAL_DIR) -> Path:
    return root / f"{model_name}-t{threads}-ngl{ngl}.json"


def calibrate(model_ref: str, threads: int = 0, ngl: int = 0, k_max: int = 16, reps: int = 3) -> dict:
    if k_max < 1 or reps < 1:
        raise HarnessError("--k-max and --reps must be >= 1")
    m = resolve(model_ref)
    require_present(m)
    cfg = EngineConfig(n_ctx=CONTEXT + k_max + 8, n_batch=max(k_max, 32), n_gpu_layers=ngl, threads=threads)
    with Engine(m.path, cfg) as e:
        filler = (e.vocab.tokenize("The quick brown fox jumps over the lazy dog. ", add_special=False) * 64)[:CONTEXT]
        e.decode(filler, logits="none")
        block = filler[:k_max]
        e.decode(block[:4], logits="all")  # warm-up
        ms = []
        for k in range(1, k_max + 1):
            times = []
            for _ in range(reps):
                e.trim(CONTEXT)
                t = time.perf_counter()
                e.decode(block[:k], logits="all")
                times.append((time.perf_counter() - t) * 1000)
            ms.append(statistics.median(times))
    return {"model": m.name, "path": str(m.path), "threads": cfg.resolved_threads(), "ngl": ngl,
            "context": CONTEXT, "k": list(range(1, k_max + 1)), "ms": ms, "reps": reps,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def save(cal: dict, root: Path = CAL_DIR) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    p = cal_path(cal["model"], cal["threads"], cal["ngl"], root)
    p.write_text(json.dumps(cal, indent=1))
    return p


def load(model_name: str, threads: int, ngl: int, root: Path = CAL_DIR) -> dict | None:
    p = cal_path(model_name, threads, ngl, root)
    return json.loads(p.read_text()) if p.exists() else None


def table_rows(cal: dict) -> list[list]:
    t1 = cal["ms"][0]
    return [[k, f"{ms:.1f}", f"{ms / k:.1f}", f"{ms / t1:.2f}x"] for k, ms in zip(cal["k"], cal["ms"])]
