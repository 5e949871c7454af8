"""The tidy export: one table, a row per configuration x category (each configuration has one policy), carrying
the machine and the model files with it, so that results from many people and machines can be pooled. Its columns
are a versioned schema (README, "Exported results"): a column is only ever added, and a new version says so."""
from __future__ import annotations

import polars as pl

TIDY_SCHEMA = 3  # 2: parallel; 3: engine, llama_server
FIGURES = ("speedup", "acceptance_rate", "mean_accepted_len", "alpha")
COLUMNS = ("target", "draft", "draft_label", "setup", "parallel", "ngl", "ngl_draft", "threads", "gamma", "adaptive",
           "verify", "p_min", "policy", "category", "prompts", "tokens_per_s", "ref_tokens_per_s", *(
               f"{x}{s}" for x in FIGURES for s in ("", "_lo", "_hi")), "peak_rss_bytes", "kv_bytes")


def tidy(sweep: pl.DataFrame, plan: dict, run: str) -> pl.DataFrame:
    s, models = plan.get("system", {}), plan.get("models", {})
    sha = {n: m.get("sha256", "") for n, m in models.items()}
    have = [c for c in COLUMNS if c in sweep.columns]
    # which engine measured each row: the harness's own loop, or llama-server (its version line, per row, as a
    # resumed run may have met another binary)
    server = pl.col("llama_server_version").fill_null("").str.strip_prefix("version: ") \
        if "llama_server_version" in sweep.columns else pl.lit("")
    return sweep.select(*have, server.alias("llama_server")).with_columns(
        pl.lit(plan.get("params", {}).get("engine", "harness")).alias("engine"),
        pl.lit(TIDY_SCHEMA).alias("schema_version"), pl.lit(run).alias("run"),
        pl.lit(s.get("cpu", "")).alias("cpu"), pl.lit(s.get("cores_physical")).alias("cores"),
        pl.lit(s.get("backend", "")).alias("backend"),
        pl.lit(s.get("packages", {}).get("llama-cpp-python", "")).alias("llama_cpp_python"),
        pl.lit(s.get("packages", {}).get("harness", "")).alias("harness_version"),
        pl.col("target").replace_strict(sha, default="").alias("target_sha256"),
        pl.col("draft").replace_strict(sha, default="").alias("draft_sha256"),
    ).select("schema_version", "run", "cpu", "cores", "backend", "llama_cpp_python", "harness_version", "engine",
             "llama_server", *have[:2],
             "target_sha256", "draft_sha256", *have[2:])
