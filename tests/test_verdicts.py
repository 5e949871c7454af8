"""report.verdicts: the verdict lines of a run with no speculative row yet, and of a configuration that never
proposed."""
from harness.analysis.verdict import NO_GAIN, PLAIN


def test_no_speculative_row_yet_gives_no_verdict_lines():
    """An interrupt after the baselines only: the report still renders (no verdicts to give)."""
    import polars as pl

    from harness.report.verdicts import verdicts
    sweep = pl.DataFrame({"target": ["t"], "policy": ["greedy"], "ngl": [0], "threads": [0], "setup": [""],
                          "category": ["code"], "draft": ["none"], "config": ["base-1"], "speedup": [1.0],
                          "speedup_se": [None], "prompts": [None], "proposed": [0]})
    noise = pl.DataFrame({"config": ["base-1"], "busy": [False]})
    assert len(verdicts(sweep, noise)) == 0


def test_a_configuration_that_never_proposed_is_plain_decoding_and_no_evidence_either_way():
    """An adaptive controller that judged every probe not worth it measures plain against plain: its interval
    straddles 1, and must not keep the other configurations' intervals below 1 from saying plain decoding."""
    import polars as pl

    from harness.report.verdicts import verdicts
    rows = {"draft": ["none", "d", "d"], "config": ["base-1", "g1-x", "auto-y"], "speedup": [1.0, 0.8, 1.0],
            "speedup_se": [None, 0.02, 0.01], "prompts": [None, 5, 5], "proposed": [0, 120, 0]}
    sweep = pl.DataFrame({"target": ["t"] * 3, "policy": ["greedy"] * 3, "ngl": [0] * 3, "threads": [0] * 3,
                          "setup": [""] * 3, "category": ["code"] * 3} | rows)
    noise = pl.DataFrame({"config": rows["config"], "busy": [False] * 3})
    assert verdicts(sweep, noise)["verdict"].to_list() == [PLAIN]
    only = sweep.filter(pl.col("config") != "g1-x")  # nothing else: still a line, not a lost group: plain
    assert verdicts(only, noise)["verdict"].to_list() == [NO_GAIN]  # against plain, 1.00x [0.97, 1.03]: no gain
