"""The time budget (bench.budget: what is cut, in which order, down to which floor), the progress lines
(bench.progress) and `bench --dry-run`. The planner and the lines are pure: a cost function stands in for the
estimate."""
import io
import json
import time
from dataclasses import replace

import pytest

from harness.bench.budget import MIN_PROMPTS, fit
from harness.bench.progress import GENERATION, Progress, clock, count, line, replay_watch, timed_watch
from harness.plan import Params
from harness.specs import Gamma
from harness.report.sections import budget_line
from tests.conftest import PROMPT_FILE, D, T
from tests.helpers import harness, one_line_error

DEFAULT = Params(target=["t"], draft=["d", "ngram:3"], gamma=list(range(1, 9)), max_tokens=32, replay=True,
                 replay_gamma=8, timed_subset=1, paired=True, budget_min=20)


def cost(p: Params, per_category: int = 10) -> float:
    """Seconds: a minute per generated token of a prompt set, and a share per replayed gamma, timed prompt and
    prompt per category (per_category: the prompts a category has)."""
    prompts = min(p.per_category or per_category, per_category)
    return 60 * (p.max_tokens * 2 + p.replay_gamma / 2 + p.timed_subset * 3) * prompts / 10


def test_nothing_is_cut_when_the_run_fits_and_without_a_budget():
    f = fit(replace(DEFAULT, budget_min=120), cost, 10, 32)
    assert f.params == replace(DEFAULT, budget_min=120) and not f.cuts and f.record()["fits"]
    assert budget_line(f.record()) == "budget 120 min (fitted to 85% of it): estimated 71.0 min as asked"
    assert budget_line(f.record(), {"total": 4200.0}).endswith("as asked; took 70.0 min before its report")
    none = fit(replace(DEFAULT, budget_min=None), cost, 10, 32)
    assert none.params.max_tokens == 32 and none.estimate_after_s == none.estimate_before_s
    assert budget_line(none.record()) is None


def test_tokens_go_first_and_only_as_far_as_needed():
    f = fit(replace(DEFAULT, budget_min=46), cost, 10, 32)  # 71 min: 16 tokens (39 min) fit 85% of 46
    assert [c.param for c in f.cuts] == ["max_tokens"] and f.params.max_tokens == 16
    assert f.params.replay_gamma == 8 and f.params.gamma == DEFAULT.gamma
    c = f.cuts[0]
    assert (c.before, c.after, c.estimate_before_s / 60, c.estimate_after_s / 60) == (32, 16, 71, 39)
    assert c.why == "estimated 71.0 min, over 39.1 min (85% of the 46 min budget)"


def test_then_the_gammas_then_the_timed_subset_then_the_prompts_each_to_its_floor():
    p = replace(DEFAULT, max_tokens=64, timed_subset=4, per_category=0, budget_min=1)
    f = fit(p, lambda q: cost(q, per_category=40), 40, 64)
    assert [(c.param, c.before, c.after) for c in f.cuts] == [
        ("max_tokens", 64, 16), ("replay_gamma", 8, 4), ("timed_subset", 4, 1), ("per_category", 40, MIN_PROMPTS)]
    # a replay predicts gammas up to replay_gamma, and only those are ever timed: the sweep follows
    assert f.params.gamma == [Gamma(n) for n in (1, 2, 3, 4)] and not f.record()["fits"]
    assert budget_line(f.record()) == (
        "budget 1 min (fitted to 85% of it): estimated 576.0 min as asked; cut max tokens 64 -> 16, replay gamma "
        "8 -> 4, timed subset 4 -> 1, prompts per category 40 -> 10: still about 37.0 min, and nothing more can be "
        "cut: running anyway")


def test_where_the_floors_do_not_fit_the_further_sweeps_go_and_the_rest_is_planned_again():
    also = [{"target": ["t16"], "temp": [0.0]}]

    def with_also(q: Params) -> float:  # a further sweep costs as much as the main one, and 3 minutes more
        return cost(q) * (1 + len(q.also)) + 180 * len(q.also)
    f = fit(replace(DEFAULT, also=also, budget_min=50), with_also, 10, 32)  # floors 2 x 37 + 3 min; alone 71
    assert f.params.also == [] and f.params.max_tokens == 16 and f.params.replay_gamma == 8
    assert [(c.param, c.before, c.after) for c in f.cuts] == [("also", ["target t16 temp 0.0"], []),
                                                              ("max_tokens", 32, 16)]
    assert (f.estimate_before_s / 60, f.estimate_after_s / 60) == (145, 39) and f.record()["fits"]
    assert f.cuts[0].why == "cut to their floors, estimated 77.0 min, over 42.5 min (85% of the 50 min budget)"
    assert budget_line(f.record()) == (
        "budget 50 min (fitted to 85% of it): estimated 145.0 min as asked; cut the further sweeps (target t16 "
        "temp 0.0: --budget-min 91 keeps them), max tokens 32 -> 16: now about 39.0 min")
    # where they fit at their floors, they stay
    kept = fit(replace(DEFAULT, also=also, budget_min=91), with_also, 10, 32)
    assert kept.params.also == also and kept.record()["fits"]


def test_a_category_of_ten_prompts_or_fewer_keeps_all_and_a_short_run_is_not_cut():
    f = fit(replace(DEFAULT, max_tokens=12, gamma=[1, 2], replay_gamma=3, budget_min=1), cost, 10, 32)
    assert not f.cuts and f.params.per_category == 0
    assert budget_line(f.record()).endswith("as asked, and nothing can be cut: running anyway")


def test_a_timed_sweep_loses_its_largest_gammas_and_keeps_auto():
    p = replace(DEFAULT, replay=False, timed_subset=0, gamma=["auto:8", 1, 2, 4, 6, 8], budget_min=1)
    f = fit(p, lambda q: 60 * len(q.gamma), 10, 32)
    assert f.params.to_dict()["gamma"] == ["auto:8", 1, 2, 4] and f.params.replay_gamma == 8
    assert [(c.param, c.before, c.after) for c in f.cuts if c.param == "gamma"] == [
        ("gamma", ["auto:8", 1, 2, 4, 6, 8], ["auto:8", 1, 2, 4])]
    assert "gammas auto:8,1,2,4,6,8 -> auto:8,1,2,4" in budget_line(f.record())


def test_each_prompts_own_max_tokens_is_halved_from_the_longest():
    f = fit(replace(DEFAULT, max_tokens=0, budget_min=1), cost, 10, 96)
    assert (f.cuts[0].before, f.params.max_tokens) == (96, 16)


# -- progress -------------------------------------------------------------------------------------------------

def test_progress_line_and_clock():
    assert clock(59.6) == "1:00" and clock(3725) == "1:02:05"
    assert line("[1/2] base", 0, 60, 12) == "[1/2] base: 0/60 prompts, 0:12 elapsed"
    assert line("[1/2] base", 20, 60, 100) == "[1/2] base: 20/60 prompts, 1:40 elapsed, about 3:20 left"
    # resumed at 40: the 10 prompts this worker ran took the 100 s
    assert line("u", 50, 60, 100, done_at_start=40) == "u: 50/60 prompts, 1:40 elapsed, about 1:40 left"
    assert line("u", 60, 60, 100) == "u: 60/60 prompts, 1:40 elapsed"
    # weighed by each prompt's estimated time: the two done were a tenth of the work
    assert line("u", 2, 4, 10, weights=[1, 1, 8, 10]) == "u: 2/4 prompts, 0:10 elapsed, about 1:30 left"
    assert line("u", 3, 4, 20, done_at_start=2, weights=[1, 1, 8, 10]) == \
        "u: 3/4 prompts, 0:20 elapsed, about 0:25 left"
    # on a terminal the label gives way, the figures stay
    assert line("[1/2] " + "x" * 100, 20, 60, 100, width=60) == \
        "[1/2] xxxxx...: 20/60 prompts, 1:40 elapsed, about 3:20 left"  # 60 characters


def test_progress_counts_the_records_a_finished_prompt_writes(tmp_path):
    from harness.trace import TraceWriter
    run = tmp_path / "run"
    spec, twin = timed_watch(run, "g2-x", paired=True)
    for path, _, _ in (spec, twin):
        path.parent.mkdir(parents=True)
    assert count([spec, twin]) == 0  # nothing written yet
    tw = TraceWriter(spec[0], config="g2-x", mode="speculative", category="code", prompt_id="p1", repeat=0)
    tw.write({"type": "step", "text": '"type": "generation"'})  # the marker inside a string does not count
    tw.write({"type": "generation", "tokens": [1, 2]})
    tw.close()
    assert count([spec]) == 1 and count([spec, twin]) == 0  # its twin has not run yet
    (f, marker, per), = replay_watch(run, "base-x", 2)
    f.parent.mkdir(parents=True)
    tw = TraceWriter(f, config="base-x", mode="replay", policy="greedy")
    tw.write({"type": "replay_prompt", "prompt_id": "p1"})
    tw.write({"type": "replay", "prompt_id": "p1", "proposer": "a"})
    assert count([(f, marker, per)]) == 0
    tw.write({"type": "replay", "prompt_id": "p1", "proposer": "b"})
    tw.close()
    assert count([(f, marker, per)]) == 1 and count(replay_watch(run, "base-x", 0)) == 1
    assert marker != GENERATION


def test_progress_says_how_far_an_interrupted_unit_got(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"type": "generation"}) + "\n")
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Progress("[1/1] base", 3, [(f, GENERATION, 1)], stream=out):
        raise KeyboardInterrupt
    assert out.getvalue() == "[1/1] base: stopped after 1 of 3 prompts\n"  # off a terminal, nothing before 30 s


def test_on_a_terminal_the_line_is_rewritten_in_place_and_cleared_at_the_end(tmp_path, monkeypatch):
    import harness.bench.progress as progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(progress, "TTY_EVERY_S", 0.01)
    f, out = tmp_path / "t.jsonl", Terminal()
    with Progress("[1/1] base", 2, [(f, GENERATION, 1)], stream=out):
        time.sleep(0.1)
        f.write_text(json.dumps({"type": "generation"}) + "\n")
        time.sleep(0.1)
    text = out.getvalue()
    assert "\r\x1b[K[1/1] base: 0/2 prompts, 0:00 elapsed\r" in text, text
    assert "\r\x1b[K[1/1] base: 1/2 prompts, 0:00 elapsed, about 0:00 left\r" in text, text
    assert text.endswith("\r\x1b[K") and "\n" not in text  # the unit's own line takes its place


# -- bench --dry-run ------------------------------------------------------------------------------------------

def test_a_dry_run_prints_the_plan_and_the_cuts_and_runs_nothing(tmp_path, smol, smol_q2k):
    out = tmp_path / "r"
    r = harness("bench", "--target", T, "--draft", f"{D},ngram:2", "--gamma", "1,2,3,4,5,6", "--prompts", PROMPT_FILE,
                "--max-tokens", "64", "--replay", "--replay-gamma", "6", "--timed-subset", "1", "--paired",
                "--budget-min", "0.01", "--dry-run", "--out", out)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("budget 0.01 min (fitted to 85% of it): estimated ")
    assert "cut max tokens 64 -> 16, replay gamma 6 -> 4" in lines[0], lines
    assert lines[0].endswith("nothing more can be cut: running anyway"), lines
    assert "x 6 prompts x 1 repeat(s); 1 unit(s) to run, then the replay of 1 baseline(s)" in r.stderr
    assert "up to gamma 4" in r.stderr and "estimated time: about" in r.stderr
    est = next(ln for ln in lines if ln.startswith("estimated time: about"))
    assert all(f"{part} " in est for part in ("units", "replay", "timed subset", "worker starts and model loads"))
    assert f"dry run: each model's probe for the estimate ({T}: a prompt token " in r.stderr, r.stderr
    assert " ms a further token of a block; loaded in " in r.stderr and f" s; {D}: " in r.stderr and not out.exists()


def test_a_dry_run_plans_a_new_run_only(tmp_path):
    one_line_error(harness("bench", "--resume", tmp_path, "--dry-run"), "--dry-run", "--resume")
