"""report/llamaserver.py's pooled figures of a `bench --engine server` run: each configuration over every request it
served, the categories together, from the traces' server figures (pure: records in, a frame and lines out)."""
import math

import polars as pl
import pytest

from harness.report.llamaserver import pooled, pooled_section


def gen(config, pid, ms, drafted=0, accepted=0, mode="speculative"):
    return {"type": "generation", "config": config, "prompt_id": pid, "repeat": 0, "mode": mode,
            "server": {"predicted_n": 11, "predicted_ms": ms, "draft_n": drafted, "draft_n_accepted": accepted}}


def frames(busy):
    cfg = pl.DataFrame({"config": ["a", "b"], "draft_label": ["ngram-cache", "d+ngram-mod"], "gamma_label": ["8", "3"],
                        "policy": ["greedy"] * 2, "target": ["t"] * 2})
    return cfg, pl.DataFrame({"config": ["a", "b"], "busy": [False, busy]})


def test_each_configuration_pools_its_requests_across_categories():
    # a: 1.25x and 0.8x of its twins (geometric mean 1); b: 2x on each of three prompts, 6 of 12 accepted
    records = [gen("a", "code-01", 80.0), gen("a", "creative-01", 125.0),
               *(gen("b", p, 50.0, 4, 2) for p in ("code-01", "creative-01", "domain-01"))]
    twins = [gen(c, p, 100.0, mode="baseline") for c, ps in (("a", ("code-01", "creative-01")),
             ("b", ("code-01", "creative-01", "domain-01"))) for p in ps]
    out = pooled(records, twins, *frames(busy=True))
    a, b = (out.filter(pl.col("config") == c).row(0, named=True) for c in ("a", "b"))
    assert a["speedup"] == pytest.approx(1.0) and a["prompts"] == 2 and a["acceptance"] is None
    assert a["lo"] < 1 < a["hi"]
    assert b["speedup"] == pytest.approx(2.0) and b["acceptance"] == pytest.approx(0.5)
    assert b["lo"] == pytest.approx(2.0) and b["hi"] == pytest.approx(2.0)  # no spread
    assert out["config"].to_list() == ["b", "a"]  # the best first
    text = "\n".join(pooled_section(out))
    assert "| greedy   | d+ngram-mod g=3 (busy) | 2.00x [2.00, 2.00]" in text, text
    assert "none drafted" in text and "--rerun-busy" in text
    assert not any(len(x) > 120 for x in text.splitlines() if x.startswith("|"))


def test_nothing_to_pool_says_nothing():
    assert pooled([], [], *frames(busy=False)) is None and pooled_section(None) == []
    assert "--rerun-busy" not in "\n".join(pooled_section(pooled(
        [gen("a", "code-01", 50.0)], [gen("a", "code-01", 100.0, mode="baseline")], *frames(busy=False))))
    assert math.isclose(pooled([gen("a", "code-01", 50.0)], [gen("a", "code-01", 100.0, mode="baseline")],
                               *frames(busy=False))["speedup"][0], 2.0)
