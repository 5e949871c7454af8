"""cli.main and the bench command's parsing, against issue 43's bad-input sweep: an option that takes one value
given twice, options that need --resume or refuse it, an advanced option parsed as before."""
from __future__ import annotations

from tests.conftest import PROMPT_FILE, T
from tests.helpers import harness, one_line_error


def test_a_profile_given_twice_is_refused(tmp_path):
    r = harness("bench", "--profile", "smoke", "--profile", "default", "--out", tmp_path / "out")
    one_line_error(r, "--profile given 2 times", "smoke, default")
    assert not (tmp_path / "out").exists()


def test_an_advanced_option_parses_as_before(monkeypatch, tmp_path):
    """--replay-gamma and its neighbours below the first screen reach the plan as they did; nothing runs."""
    import harness.bench.run as bench_run
    seen = []
    monkeypatch.setattr(bench_run, "run_bench", lambda params, *a, **kw: seen.append(params))
    args = ("bench", "--target", "t.gguf", "--draft", "ngram:2", "--gamma", "2", "--prompts", str(PROMPT_FILE),
            "--out", tmp_path / "out")
    r = harness(*args, "--replay", "--replay-gamma", "3", "--timed-subset", "1", "--paired", "--min-gain", "0.1")
    assert r.returncode == 0, r.stderr
    (p,) = seen
    assert (p.replay, p.replay_gamma, p.timed_subset, p.paired, p.min_gain) == (True, 3, 1, True, 0.1)
    one_line_error(harness(*args, "--replay-gamma", "3"), "--replay-gamma 3", "give --replay")
    assert len(seen) == 1 and not (tmp_path / "out").exists()


def test_rerun_busy_needs_resume(tmp_path):
    one_line_error(harness("bench", "--target", T, "--rerun-busy", "--out", str(tmp_path / "r")), "--resume")


def test_a_dry_run_plans_a_new_run_only(tmp_path):
    one_line_error(harness("bench", "--resume", tmp_path, "--dry-run"), "--dry-run", "--resume")


def test_run_and_bench_share_one_declaration_of_their_options_with_the_plans_defaults():
    """SHARED declares each option once: bench takes a comma list, run one value (typed), and both show Params'
    default, never one spelled by hand."""
    from harness.cli import SHARED, bench, run
    from harness.plan import Params
    defaults = Params().to_dict()
    for cmd, many in ((bench, True), (run, False)):
        opts = {p.name: p for p in cmd.params}
        for name, kind, _ in SHARED:
            d = defaults[name]
            listed = isinstance(d, list)
            shown = ",".join(map(str, d)) if listed else str(d)
            assert opts[name].help.endswith(f"; default {shown}."), (cmd.name, name)
            assert opts[name].help.startswith("Comma list: ") == (many and listed), (cmd.name, name)
            if not (many and listed):
                assert opts[name].type.name == {int: "integer", float: "float", str: "text"}[kind], (cmd.name, name)
