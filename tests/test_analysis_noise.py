"""analysis.noise, pure: what counts as a busy machine (a sustained stretch, not a blip) and a slowed
worker."""
import pytest

from harness.analysis.noise import summarize


def test_busy_is_a_sustained_stretch_not_a_blip():
    blip = [0.0] * 20 + [0.1] + [0.0] * 20  # 200 ms of one core (of two) in one second: a shell command
    assert not summarize(blip, 0.05)["busy"] and summarize(blip, 0.05)["foreign_max"] == pytest.approx(0.01)
    spell = [0.0] * 10 + [0.08] * 10 + [0.0] * 10  # a tenth of a core (of two) for ten seconds
    assert summarize(spell, 0.05)["busy"]
    assert summarize([0.2, 0.2], 0.05)["busy"] and summarize([], 0.05) == {
        "foreign_mean": 0.0, "foreign_max": 0.0, "own_mean": None, "slowed": False, "busy": False}


def test_a_slowed_worker_is_marked_though_no_other_process_is_busy():
    """A unit's own CPU share against what its threads ask for: stopped and resumed (a laptop's power management)
    it gets a fraction; a unit shorter than the window, or one with offload (asked None), is not judged."""
    from harness.analysis.noise import SLOWED
    idle = [0.0] * 12
    got = summarize(idle, 0.05, own=[0.15] * 12, asked=1.0)
    assert got["slowed"] and got["busy"] and got["own_mean"] == pytest.approx(0.15)
    assert not summarize(idle, 0.05, own=[0.9] * 12, asked=1.0)["busy"]
    assert not summarize(idle, 0.05, own=[SLOWED * 0.5 + 0.01] * 12, asked=0.5)["busy"]  # 1 thread of 2 cores
    assert not summarize(idle, 0.05, own=[0.1] * 2, asked=1.0)["busy"]  # too short to judge
    assert not summarize(idle, 0.05, own=[0.1] * 12, asked=None)["busy"]
