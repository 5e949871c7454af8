"""bench/autodraft.py: `harness bench --target PATH` with no --draft picks the drafts itself: over folders of tiny
GGUFs the tests write (which GGUFs, and the model-free proposers alone where none fits), and one real short run on
SmolLM2 beside its Q2_K (slow tier)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from harness.bench.autodraft import BUDGET_MIN, LLAMA_TYPE, LOOKUP, pick, with_drafts
from harness.specs import parse_draft
from tests.helpers import harness, only_run
from tests.tiny_gguf import write_tiny_model

FREE = [LOOKUP, LLAMA_TYPE]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """target.gguf beside: small (its tokenizer, under half its size), small2 (the same, a little bigger), bigger
    (its tokenizer, not smaller), other (another tokenizer)."""
    d = tmp_path_factory.mktemp("autodraft")
    write_tiny_model(d / "target.gguf", n_layer=3)
    write_tiny_model(d / "all" / "small.gguf", seed=2, n_layer=1, n_embd=32, n_ff=32)
    write_tiny_model(d / "all" / "small2.gguf", seed=3, n_layer=1, n_embd=32, n_ff=48)
    write_tiny_model(d / "all" / "bigger.gguf", n_layer=6, n_ff=256)
    write_tiny_model(d / "all" / "other.gguf", variant="other_tokenizer")
    for stem in ("bigger", "other"):
        (d / "big" / f"{stem}.gguf").parent.mkdir(exist_ok=True)
        (d / "big" / f"{stem}.gguf").write_bytes((d / "all" / f"{stem}.gguf").read_bytes())
    (d / "none").mkdir()
    (d / "none" / "other.gguf").write_bytes((d / "all" / "other.gguf").read_bytes())
    return d


def test_the_two_best_faster_drafts_and_the_model_free_proposers(folder):
    drafts, lines = pick([str(folder / "target.gguf")], [folder / "all"])
    assert drafts == [str(folder / "all" / "small.gguf"), str(folder / "all" / "small2.gguf"), *FREE]
    assert all(parse_draft(d) for d in drafts)  # each as bench reads it
    assert lines[0].startswith("No --draft: picked for target")
    assert "llama-server takes it; harness check ALIGNED" in lines[1] and "unlikely" not in lines[1]


def test_only_a_bigger_draft_is_taken_and_said_to_be_unlikely_to_gain(folder):
    drafts, lines = pick([str(folder / "target.gguf")], [folder / "big"])
    assert drafts == [str(folder / "big" / "bigger.gguf"), *FREE]
    assert "unlikely to gain" in lines[1]


def test_no_compatible_draft_runs_the_model_free_proposers_and_says_so(folder):
    drafts, lines = pick([str(folder / "target.gguf")], [folder / "none"])
    assert drafts == FREE
    assert "no draft model: none of the 1 GGUFs" in lines[1] and "model-free proposers only" in lines[1]


def test_given_drafts_or_a_profile_are_left_alone(folder, capsys):
    target = str(folder / "target.gguf")
    for profile, opts in ((None, {"target": target, "draft": "ngram:2"}), ("smoke", {"target": target, "draft": None}),
                          (None, {"target": None, "draft": None})):
        assert with_drafts(profile, opts, [folder / "all"]) is opts
    assert capsys.readouterr().err == ""
    got = with_drafts(None, {"target": target, "draft": None, "budget_min": None}, [folder / "none"])
    assert got["draft"] == FREE and got["budget_min"] == BUDGET_MIN
    err = capsys.readouterr().err
    assert "model-free proposers only" in err and f"budget: {BUDGET_MIN:g} minutes" in err
    assert with_drafts(None, {"target": target, "draft": None, "budget_min": 3.0}, [folder / "none"])["budget_min"] == 3
    # plan refuses llama.cpp's n-gram types with --parallel above 1: left out there, and said so; the replay
    # prices them
    assert with_drafts(None, {"target": target, "draft": None, "parallel": "1,2"}, [folder / "none"])["draft"] == \
        [LOOKUP]
    assert "left out, as --parallel does not take" in capsys.readouterr().err
    for opt in ({"parallel": "1"}, {"replay": True}):
        assert with_drafts(None, {"target": target, "draft": None} | opt, [folder / "none"])["draft"] == FREE


@pytest.mark.slow  # 4 configurations, one 4-token prompt, the reports: estimated 1.2 min on the 2-core VM alone;
# 8 min there under other processes' load, which measures its busy units again
def test_bench_with_one_path_picks_the_q2k_beside_it(tmp_path, smol, smol_q2k):
    """The user types one command with one path: SmolLM2 in a folder of its own beside its Q2_K."""
    d = tmp_path / "models"
    d.mkdir()
    for m in (smol, smol_q2k):
        (d / m.name).symlink_to(m)
    target = d / smol.name
    # --allow-busy: what is checked is the picking and a finished run, not its timings
    r = harness("bench", "--target", target, "--categories", "code", "--per-category", "1", "--max-tokens", "4",
                "--out", tmp_path / "out", "--allow-busy")
    assert r.returncode == 0, r.stderr
    assert f"No --draft: picked for {smol.stem}" in r.stderr and "unlikely to gain" in r.stderr
    assert "budget: 20 minutes" in r.stderr
    plan = json.loads((only_run(tmp_path / "out") / "plan.json").read_text())
    assert plan["params"]["draft"] == [smol_q2k.stem, *FREE]  # the Q2_K is in the catalog: named as it is there
    assert plan["params"]["budget_min"] == BUDGET_MIN


# -- issue 57: what lies beside the target -------------------------------------------------------------------------
def test_fifos_nested_arrays_and_a_plus_beside_the_target(tmp_path):  # cases 126, 127, 129
    from tests.helpers import nested_gguf, within
    target = write_tiny_model(tmp_path / "target.gguf", n_layer=3)
    small = write_tiny_model(tmp_path / "smol+q2.gguf", seed=2, n_layer=1, n_embd=32, n_ff=32)
    os.mkfifo(tmp_path / "blob")
    os.mkfifo(tmp_path / "pipe.gguf")
    nested_gguf(tmp_path / "deep.gguf")
    with within(30):
        drafts, _ = pick([str(target)], [tmp_path])
    assert drafts == [str(small), *FREE]
    assert parse_draft(drafts[0]).model == str(small)  # its own pick, read back whole


def test_engine_server_picks_no_harness_lookup(folder, capsys):  # case 125
    got = with_drafts(None, {"target": str(folder / "target.gguf"), "draft": None, "engine": "server"},
                      [folder / "none"])
    assert got["draft"] == [LLAMA_TYPE]
    assert "left out, as llama-server (--engine server) lacks it" in capsys.readouterr().err


def test_a_refusal_over_a_picked_draft_says_it_was_picked(folder):  # case 128
    from harness.bench.autodraft import owning_picks
    from harness.errors import HarnessError
    given = {"target": "t", "draft": None}
    picked = given | {"draft": [str(folder / "all" / "small.gguf"), *FREE]}
    with pytest.raises(HarnessError) as e, owning_picks(given, picked):
        raise HarnessError(f"model 'small' at {folder / 'all' / 'small.gguf'} failed to load")
    assert "was picked as a draft for you, not named: choose the drafts with --draft" in str(e.value)
    with pytest.raises(HarnessError) as e, owning_picks(given, given):  # nothing picked: the refusal as it was
        raise HarnessError("model 'small' failed to load")
    assert "picked" not in str(e.value)
