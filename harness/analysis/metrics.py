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

import math

import polars as pl

from harness.divergence import first_divergence

CONF_BUCKETS = [0.5, 0.8, 0.95]
GEN_KEYS = ["config", "category", "prompt_id", "repeat"]  # one generation
CONF_LABELS = ["<0.5", "0.5-0.8", "0.8-0.95", ">=0.95"]


def frame(records: list[dict], kind: str) -> pl.DataFrame:
    rows = [r for r in records if r.get("type") == kind]
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def frames(records: list[dict]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Step and generation records."""
    return frame(records, "step"), frame(records, "generation")


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


def measured_mean(col: str) -> pl.Expr:
    """The mean over a group's generations, or null where one of them lacks the figure (a prompt restored from
    the run's prompt cache has no evaluation time, its generation no latency): a mean of the others would pass
    for all's."""
    c = pl.col(col)
    return pl.when(c.is_null().any()).then(None).otherwise(c.mean()).alias(col)


def throughput(gens: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """prompt_restored: some generation restored a prompt from the run's prompt cache (its latency is null)."""
    return gens.group_by(by, maintain_order=True).agg(
        pl.len().alias("generations"),
        pl.col("n_tokens").sum().alias("tokens"),
        pl.col("gen_ms").sum(),
        measured_mean("latency_ms"),
        pl.col("latency_ms").is_null().any().alias("prompt_restored"),
        measured_mean("prompt_eval_ms"),
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


def classify(spec_tokens: list[int], base_tokens: list[int], evidence: dict | None) -> dict:
    """A greedy speculative output against plain greedy decoding: 'equal', or the kind the worker's kernel check
    (harness.divergence) found at the first divergence; 'unchecked' where no check was recorded."""
    at = first_divergence(spec_tokens, base_tokens)
    if at is None:
        return {"equal": True, "diverged_at": None, "margin": None, "kind": "equal"}
    ev = evidence if evidence and evidence.get("diverged_at") == at else {}
    return {"equal": False, "diverged_at": at, "margin": ev.get("margin"), "kind": ev.get("kind", "unchecked")}


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


def timing_floor(steps: pl.DataFrame, p_steps: pl.DataFrame, min_plain: int = 4) -> pl.DataFrame:
    """Two timings of the same work, seconds apart: per speculative generation with a plain twin (same
    configuration, prompt and repeat) and at least min_plain steps that proposed nothing (a lookup that found no
    match), the target's one-token decodes in those steps against the twin's, as "ratio" = the twin's mean over
    theirs. How far it strays from 1 is how far a timed speedup moves by itself: the machine's pace moving
    between the two generations moves the measured speedup as much, and no prediction can follow it."""
    keys = GEN_KEYS
    if not len(steps) or not len(p_steps) or not set(keys) <= set(steps.columns) & set(p_steps.columns):
        return pl.DataFrame()
    def rel_var(name: str) -> pl.Expr:  # the relative variance of the mean of these decodes: their own scatter
        return (pl.col("verify_ms").var() / pl.col("verify_ms").mean() ** 2 / pl.len()).alias(f"{name}_rv")
    spec = steps.filter((pl.col("mode") == "speculative") & (pl.col("proposed") == 0)).group_by(keys).agg(
        pl.col("verify_ms").mean().alias("spec_ms"), pl.len().alias("plain_steps"), rel_var("spec"))
    twin = p_steps.filter(pl.col("mode") == "baseline").group_by(keys).agg(
        pl.col("verify_ms").mean().alias("twin_ms"), rel_var("twin"))
    return spec.filter(pl.col("plain_steps") >= min_plain).join(twin, on=keys).with_columns(
        (pl.col("twin_ms") / pl.col("spec_ms")).alias("ratio")).sort(keys)


def pace_spread(floor: pl.DataFrame) -> float:
    """The spread (log scale) of the machine's pace between a speculative generation and its plain twin, beyond
    what the scatter of their decodes explains: sqrt(mean(log(ratio)^2) - mean of both means' relative
    variances) over timing_floor's generations; 0 where the scatter explains it all, or nothing was measured."""
    if not len(floor):
        return 0.0
    v = (floor["ratio"].log() ** 2).mean() - (floor["spec_rv"] + floor["twin_rv"]).mean()
    return math.sqrt(max(v, 0.0))
