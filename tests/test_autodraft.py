"""bench/autodraft.py: `harness bench --target PATH` with no --draft picks the drafts itself and runs the default
profile's method: over folders of tiny GGUFs the tests write (which GGUFs, and the model-free proposers alone where
none fits), a dry run on SmolLM2 beside its Q2_K (what it plans), and one real short run (slow tier)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from harness.bench.autodraft import BUDGET_MIN, LLAMA_TYPE, LOOKUP, default_method, pick, with_drafts
from harness.plan import load_profile
from harness.specs import parse_draft
from tests.helpers import harness, only_run
from tests.tiny_gguf import write_tiny_model

DEFAULT = load_profile("default")
FREE = [d for d in DEFAULT["draft"] if parse_draft(d).model_free]  # the lookup and llama.cpp's n-gram types


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
    drafts, lines = pick([str(folder / "target.gguf")], [folder / "all"], FREE)
    assert drafts == [str(folder / "all" / "small.gguf"), str(folder / "all" / "small2.gguf"), *FREE]
    assert LOOKUP in FREE and any(d.startswith("ngram-mod") for d in FREE) and "ngram-cache" in FREE
    assert all(parse_draft(d) for d in drafts)  # each as bench reads it
    assert lines[0].startswith("No --draft: picked for target")
    assert "llama-server takes it; harness check ALIGNED" in lines[1] and "unlikely" not in lines[1]


def test_only_a_bigger_draft_is_taken_and_said_to_be_unlikely_to_gain(folder):
    drafts, lines = pick([str(folder / "target.gguf")], [folder / "big"])
    assert drafts == [str(folder / "big" / "bigger.gguf"), LOOKUP, LLAMA_TYPE]  # without the profile's
    assert "unlikely to gain" in lines[1]


def test_no_compatible_draft_runs_the_model_free_proposers_and_says_so(folder):
    drafts, lines = pick([str(folder / "target.gguf")], [folder / "none"], FREE)
    assert drafts == FREE
    assert "no draft model: none of the 1 GGUFs" in lines[1] and "model-free proposers only" in lines[1]


def test_given_drafts_or_a_profile_are_left_alone(folder, capsys):
    target = str(folder / "target.gguf")
    for profile, opts in ((None, {"target": target, "draft": "ngram:2"}), ("smoke", {"target": target, "draft": None}),
                          (None, {"target": None, "draft": None})):
        assert with_drafts(profile, opts, [folder / "all"]) is opts
    assert capsys.readouterr().err == ""
    got = with_drafts(None, {"target": target, "draft": None, "budget_min": None}, [folder / "none"])
    assert got["draft"] == FREE and got["budget_min"] == DEFAULT["budget_min"] == BUDGET_MIN
    err = capsys.readouterr().err
    assert "model-free proposers only" in err and f"budget: {BUDGET_MIN:g} minutes" in err
    assert with_drafts(None, {"target": target, "draft": None, "budget_min": 3.0}, [folder / "none"])["budget_min"] == 3
    # plan refuses llama.cpp's n-gram types and the replay with --parallel above 1: left out there, and said so
    par = with_drafts(None, {"target": target, "draft": None, "parallel": "1,2"}, [folder / "none"])
    assert par["draft"] == [LOOKUP] and "replay" not in par and "timed_subset" not in par
    assert "no replay nor llama.cpp's n-gram types: --parallel does not take them" in capsys.readouterr().err
    for opt in ({"parallel": "1"}, {"replay": True}):
        assert with_drafts(None, {"target": target, "draft": None} | opt, [folder / "none"])["draft"] == FREE
    # what a given option refuses of the method goes; llama-server has no prompt lookup of the harness's
    assert "timed_subset" not in with_drafts(None, {"target": target, "draft": None, "replay": False},
                                             [folder / "none"])
    server = with_drafts(None, {"target": target, "draft": None, "engine": "server"}, [folder / "none"])
    assert LOOKUP not in server["draft"] and "server_check" not in server and "replay" not in server


def test_a_bare_target_gets_the_default_profiles_method_but_what_is_given():
    method, free, said = default_method()
    assert method == {k: v for k, v in DEFAULT.items() if k not in ("target", "draft", "also")} and free == FREE
    assert method["replay"] and method["temp"] == [0.0, 0.7] and len(method["gamma"]) > 2
    assert said.startswith("  method: the 'default' profile's (profiles.toml): gamma 1,2,3,4,5,6,7,8, temp 0.0,0.7")


def test_what_is_given_stands_over_the_method(folder, capsys):
    got = with_drafts(None, {"target": str(folder / "target.gguf"), "draft": None, "gamma": "4", "temp": None,
                             "max_tokens": 32}, [folder / "none"])
    assert (got["gamma"], got["max_tokens"], got["temp"]) == ("4", 32, DEFAULT["temp"])
    assert got["replay"] and got["timed_subset"] == DEFAULT["timed_subset"]


def test_bench_target_dry_run_plans_the_default_method_on_smollm2(tmp_path, smol, smol_q2k):
    """The user types one command with one path and --dry-run: the replay of every prompt, the gamma sweep,
    both policies, the timed subset and the llama-server check, as the default profile plans them, fitted to the
    budget (a budget that holds it all here: what the default's 20 minutes keep depends on the machine's probes,
    which other processes slow)."""
    d = tmp_path / "models"
    d.mkdir()
    for m in (smol, smol_q2k):
        (d / m.name).symlink_to(m)
    r = harness("bench", "--target", d / smol.name, "--budget-min", "600", "--dry-run", "--allow-busy", "--out",
                tmp_path / "out")
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "method: the 'default' profile's" in err and "\nbudget 600 min (fitted to 85% of it): estimated " in err
    covers = next(ln for ln in err.splitlines() if ln.startswith("covers: "))
    assert f"drafts {smol_q2k.stem}, {', '.join(FREE)}; gammas 1, 2, 3, 4, 5, 6, 7, 8 (replayed up to 8)" in covers
    assert "policies greedy, T=0.7 top_p=0.9; 10 prompt(s) in each of 6 categories (60), 128 tokens each" in covers
    assert "timed: proposers on 3 prompt(s) a category; llama-server check: 5 prompt(s) an answer" in covers
    assert "then the replay of 2 baseline(s) through " in err and not (tmp_path / "out").exists()


@pytest.mark.slow  # the default profile's method on one 4-token prompt, both policies, replayed, a timed subset
# and (where make native built one) llama-server's check, the reports
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
    assert plan["params"]["budget_min"] == BUDGET_MIN and plan["params"]["replay"]
    assert plan["params"]["temp"] == DEFAULT["temp"] and plan["params"]["max_tokens"] == 4


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
    assert drafts == [str(small), LOOKUP, LLAMA_TYPE]
    assert parse_draft(drafts[0]).model == str(small)  # its own pick, read back whole


def test_a_gguf_llama_cpp_cannot_load_beside_the_target_is_not_picked(tmp_path):  # cases 96, 128
    target = write_tiny_model(tmp_path / "target.gguf", n_layer=3)
    bad = write_tiny_model(tmp_path / "small.gguf", seed=2, n_layer=1, n_embd=32, n_ff=32)
    bad.write_bytes(bad.read_bytes().replace(b"general.architecture", b"general.architecturX", 1))
    drafts, _ = pick([str(target)], [tmp_path])
    assert drafts == [LOOKUP, LLAMA_TYPE]


def test_engine_server_picks_no_harness_lookup(folder, capsys):  # case 125
    got = with_drafts(None, {"target": str(folder / "target.gguf"), "draft": None, "engine": "server"},
                      [folder / "none"])
    assert got["draft"] == [d for d in FREE if not d.startswith("ngram:")]
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
