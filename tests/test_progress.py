"""bench.progress: the progress line, its clock and its counts, on a terminal and not."""
import io
import json
import time

import pytest

from harness.bench.progress import GENERATION, Progress, clock, count, line, replay_watch, timed_watch


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
