"""A profile's further sweeps (`also`): instances added beside the main product, dropped where the command line
sets the same list, refused in one line when malformed."""
import pytest

from harness.errors import HarnessError
from harness.plan import expand, make_params

PROFILE = {"target": ["t-q4"], "draft": ["d1", "ngram:3"], "gamma": [1, 4], "temp": [0.0, 0.7], "top_p": [0.9],
           "also": [{"target": ["t-f16"], "draft": ["d1"], "temp": [0.0]}]}


def test_also_adds_its_own_product_beside_the_main_one():
    inst = expand(make_params(PROFILE, {}))
    f16 = [i for i in inst if i.target == "t-f16"]
    # one greedy baseline, and d1 at each gamma of the main sweep (inherited), greedy only
    assert sorted((str(i.draft), i.gamma) for i in f16) == [("d1", 1), ("d1", 4), ("none", 0)]
    assert all(i.policy.greedy for i in f16)
    assert len([i for i in inst if i.target == "t-q4"]) == 2 * (1 + 2 * 2)


def test_an_instance_in_both_sweeps_runs_once():
    prof = PROFILE | {"also": [{"draft": ["d1"]}]}  # a subset of the main sweep
    assert len(expand(make_params(prof, {}))) == len(expand(make_params(PROFILE | {"also": []}, {})))


def test_a_list_given_on_the_command_line_drops_the_sweeps_that_set_it():
    assert {i.target for i in expand(make_params(PROFILE, {"target": "mine"}))} == {"mine"}
    # a list the further sweep does not set keeps it, with the command line's value inherited
    inst = expand(make_params(PROFILE, {"gamma": "2"}))
    assert {i.target for i in inst} == {"t-q4", "t-f16"} and {i.gamma for i in inst} == {0, 2}


@pytest.mark.parametrize("also", [[{"per_category": 3}], [{}], ["t-f16"], [{"target": [["x"]]}]])
def test_a_malformed_further_sweep_is_refused(also):
    with pytest.raises(HarnessError, match="also|target"):
        expand(make_params(PROFILE | {"also": also}, {}))


def test_a_further_sweep_is_checked_like_the_main_one():
    with pytest.raises(HarnessError, match="threads"):
        make_params(PROFILE | {"also": [{"threads": [-1]}]}, {})


def test_each_baseline_is_replayed_through_its_own_sweeps_drafts_only():
    from harness.bench.replay import proposers
    p = make_params(PROFILE, {})
    inst = expand(p)
    by_target = {b.target: [str(d) for d in proposers(inst, p, b)] for b in inst if b.baseline}
    assert by_target == {"t-q4": ["d1", "ngram:3"], "t-f16": ["d1"]}
