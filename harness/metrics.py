"""Metrics from traces only: pure functions over polars frames of step and generation records.

Three acceptance figures, never conflated:
- acceptance_rate = accepted / proposed draft tokens;
- mean_accepted_len = accepted draft tokens per verification step (a step that proposed at least one);
- alpha = mean of sum_x min(p(x), q(x)) (Leviathan et al. 2023) over the positions verification reached (each
  step's accepted drafts and its first rejection), with p and q the processed distributions of the run's
  sampling policy (one-hot under greedy, so alpha is then the rate at which draft and target argmax agree where
  they were compared on the output's own prefix). Traces keep every proposed position; those after a rejection
  sit on a prefix the output never contains, so Leviathan's alpha leaves them out.
accepted counts the draft tokens the output contains: when an accepted draft token ends the generation (end of
generation), neither it nor the drafts after it are in the output or counted (the trace keeps the verifier's
count as accepted_raw).
"""
from __future__ import annotations

import polars as pl

# Greedy outputs may part where the target's top two logits are nearly tied: llama.cpp's batched and
# single-token kernels round differently. Below this top-1/top-2 logit margin a divergence is a "near-tie".
NEAR_TIE_LOGITS = 0.1
CONF_BUCKETS = [0.5, 0.8, 0.95]
CONF_LABELS = ["<0.5", "0.5-0.8", "0.8-0.95", ">=0.95"]


def frames(records: list[dict]) -> tuple[pl.DataFrame, pl.DataFrame]:
    steps = [r for r in records if r.get("type") == "step"]
    gens = [r for r in records if r.get("type") == "generation"]
    return (pl.DataFrame(steps, infer_schema_length=None) if steps else pl.DataFrame(),
            pl.DataFrame(gens, infer_schema_length=None) if gens else pl.DataFrame())


def safe_div(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    return pl.when(b > 0).then(a / b).otherwise(None)


# Positions verification reached in a step: its accepted drafts and, when it rejected one, that one. Later
# positions sat on a prefix the output never contains; so did those after an accepted draft that ended the
# output (end of generation), which is why a step without a rejection reaches only its accepted drafts.
REACHED = pl.col("accepted") + pl.col("rejected_at").is_not_null().cast(pl.Int64)


def acceptance(steps: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group: proposed, accepted, the three acceptance figures, tokens per target call, step costs."""
    spec = pl.col("proposed") > 0
    return steps.group_by(by, maintain_order=True).agg(
        pl.len().alias("target_calls"),
        spec.sum().alias("verify_steps"),
        pl.col("proposed").sum(),
        pl.col("accepted").sum(),
        pl.col("emitted").sum(),
        # relative standard error of tokens per call: how far a short run's acceptance draws alone move it
        safe_div(pl.col("emitted").std(), pl.col("emitted").mean() * pl.len().sqrt()).alias("tokens_per_call_rse"),
        pl.col("alpha").list.head(REACHED).explode().drop_nulls().mean().alias("alpha"),
        pl.col("draft_ms").sum(),
        pl.col("verify_ms").sum(),
        pl.col("overhead_ms").sum(),
    ).with_columns(
        safe_div(pl.col("accepted"), pl.col("proposed")).alias("acceptance_rate"),
        safe_div(pl.col("accepted"), pl.col("verify_steps")).alias("mean_accepted_len"),
        safe_div(pl.col("emitted"), pl.col("target_calls")).alias("tokens_per_call"),
    )


def throughput(gens: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    return gens.group_by(by, maintain_order=True).agg(
        pl.len().alias("generations"),
        pl.col("n_tokens").sum().alias("tokens"),
        pl.col("gen_ms").sum(),
        pl.col("latency_ms").mean().alias("latency_ms"),
        pl.col("prompt_eval_ms").mean().alias("prompt_eval_ms"),
        (pl.col("prompt_tokens") + pl.col("n_tokens") / 2).mean().alias("context"),
    ).with_columns(
        safe_div(pl.col("tokens") * 1000.0, pl.col("gen_ms")).alias("tokens_per_s"),
        safe_div(pl.col("tokens"), pl.col("gen_ms")).alias("tokens_per_ms"),
    )


def per_position(steps: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """P(position i accepted | i proposed and every earlier position accepted), positions 1..gamma."""
    s = steps.filter(pl.col("proposed") > 0).with_columns(pl.int_ranges(1, pl.col("proposed") + 1).alias("pos"))
    s = s.explode("pos").filter(pl.col("pos") <= REACHED)
    return s.group_by([*by, "pos"], maintain_order=True).agg(
        (pl.col("pos") <= pl.col("accepted")).mean().alias("accept_prob"), pl.len().alias("tested")
    ).sort([*by, "pos"])


def rejection_histogram(steps: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Where verification steps stopped: rejection position 0..gamma-1, or 'none' when all were accepted."""
    s = steps.filter(pl.col("proposed") > 0).with_columns(
        pl.col("rejected_at").cast(pl.String).fill_null("none").alias("rejected_at"))
    return s.group_by([*by, "rejected_at"], maintain_order=True).agg(pl.len().alias("steps")).sort([*by, "rejected_at"])


def by_confidence(steps: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Acceptance of tested draft positions by the target's top probability at that position."""
    s = steps.filter(pl.col("proposed") > 0).with_columns(
        pl.int_ranges(0, pl.col("proposed")).alias("i"),
        pl.col("target_conf").list.head(pl.col("proposed")).alias("conf"))
    s = s.explode(["i", "conf"]).filter(pl.col("i") < REACHED)
    s = s.with_columns(pl.col("conf").cut(CONF_BUCKETS, labels=CONF_LABELS, left_closed=True).alias("target_conf"))
    return s.group_by([*by, "target_conf"], maintain_order=True).agg(
        (pl.col("i") < pl.col("accepted")).mean().alias("accept_prob"), pl.len().alias("tested")
    ).sort([*by, "target_conf"])


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(spec_tokens: list[int], base_tokens: list[int], base_margins: list[float]) -> dict:
    """'equal', 'near-tie' (the baseline's margin at the divergence is below NEAR_TIE_LOGITS) or 'mismatch'."""
    at = first_divergence(spec_tokens, base_tokens)
    if at is None:
        return {"equal": True, "diverged_at": None, "margin": None, "kind": "equal"}
    margin = base_margins[at] if at < len(base_margins) else None
    kind = "near-tie" if margin is not None and margin < NEAR_TIE_LOGITS else "mismatch"
    return {"equal": False, "diverged_at": at, "margin": margin, "kind": kind}


def summary(records: list[dict]) -> dict:
    """One generation's (or one config's) headline figures, as `harness run` prints them."""
    steps, gens = frames(records)
    out = {}
    if len(steps):
        acc = acceptance(steps.with_columns(pl.lit(1).alias("_")), ["_"]).row(0, named=True)
        out.update({k: acc[k] for k in ("proposed", "accepted", "acceptance_rate", "mean_accepted_len",
                                        "tokens_per_call", "alpha", "draft_ms", "verify_ms", "overhead_ms",
                                        "target_calls")})
    if len(gens):
        tp = throughput(gens.with_columns(pl.lit(1).alias("_")), ["_"]).row(0, named=True)
        out.update({k: tp[k] for k in ("tokens", "gen_ms", "tokens_per_s", "latency_ms")})
    return out
