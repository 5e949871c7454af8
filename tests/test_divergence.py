"""Greedy divergences classified by evidence: the target re-evaluated one token at a time and inside the
verification block, on a scripted engine whose batched kernel picks another token at one position."""
import numpy as np
import pytest

from harness.divergence import blocks, first_divergence, kernel_check, margin, unknown_blocks_check
from harness.loop import Request, generate
from harness.sampling import Policy
from harness.trace import TraceWriter
from tests.fakes import FakeEngine, ScriptedProposer

PROMPT = [1, 2, 3]
SCRIPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def run(target, gamma=None):
    tw = TraceWriter(None, keep=True)
    prop = ScriptedProposer(len(PROMPT), SCRIPT) if gamma else None
    gen = generate(target, Request("p", PROMPT, 8), Policy(), prop, gamma or 0, tw)
    return gen["tokens"], blocks(tw.records)


def test_a_kernel_near_tie_above_the_old_fixed_margin_is_not_a_mismatch():
    """At position 3 the batched kernel picks 15 where a single-token decode picks 8, with a top-2 margin of
    0.119: above the 0.1 the report used to call a mismatch (the issue's Hawaii prompt)."""
    target = FakeEngine(len(PROMPT), SCRIPT, batched={3: 15}, margin=0.119)
    plain, _ = run(target)
    spec, blocks = run(target, gamma=3)
    assert plain[:4] == [5, 6, 7, 8] and spec[:4] == [5, 6, 7, 15]
    found = kernel_check(target, PROMPT, spec, blocks, plain)
    assert found["kind"] == "kernel near-tie" and found["diverged_at"] == 3
    assert (found["plain_argmax"], found["block_argmax"], found["block_len"]) == (8, 15, 4)
    assert found["margin"] == pytest.approx(0.119, abs=1e-4)


def test_a_token_the_target_does_not_choose_either_way_is_a_mismatch():
    target = FakeEngine(len(PROMPT), SCRIPT)
    plain, _ = run(target)
    spec = [5, 6, 9, 8, 9, 10, 11, 12]  # what a broken verifier might emit at position 2
    found = kernel_check(target, PROMPT, spec, [(3, 4), (3, 4)], plain)
    assert found["kind"] == "mismatch" and found["diverged_at"] == 2
    assert found["plain_argmax"] == found["block_argmax"] == 7


def test_equal_outputs_need_no_check():
    target = FakeEngine(len(PROMPT), SCRIPT)
    plain, _ = run(target)
    spec, blocks = run(target, gamma=2)
    assert spec == plain and kernel_check(target, PROMPT, spec, blocks, plain) is None


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one ended (end of generation) where the other went on
    assert first_divergence([], []) is None


def test_margin():
    assert margin(np.array([0.0, 2.5, 1.0, 2.0])) == pytest.approx(0.5)
    assert margin(np.array([3.0, 3.0])) == 0.0


def test_a_servers_divergence_is_checked_at_every_block_it_could_have_run_in():
    """llama-server reports no blocks: a block of some size and offset that chooses the speculative token is the
    kernels' doing (near-tie); where none does, the server's own kernels decided it, unreproduced here: unchecked,
    not called a mismatch."""
    target = FakeEngine(len(PROMPT), SCRIPT, batched={3: 15}, margin=0.119)
    plain, _ = run(target)
    spec, _ = run(target, gamma=3)
    found = unknown_blocks_check(target, PROMPT, spec, plain, longest=3)
    assert found["kind"] == "kernel near-tie" and found["diverged_at"] == 3 and found["block_argmax"] == 15
    assert found["margin"] == pytest.approx(0.119, abs=1e-4) and found["plain_argmax"] == 8
    broken = [5, 6, 9, 8, 9, 10, 11, 12]
    found = unknown_blocks_check(FakeEngine(len(PROMPT), SCRIPT), PROMPT, broken, plain, longest=3)
    assert found["kind"] == "unchecked" and found["diverged_at"] == 2 and "2 to 4 rows" in found["why"]
    # this process's own single-token evaluation choosing the server's speculative token is evidence enough
    found = unknown_blocks_check(FakeEngine(len(PROMPT), SCRIPT), PROMPT, plain, [5, 6, 9, 8], longest=3)
    assert (found["kind"], found["block_len"]) == ("kernel near-tie", 1)
    assert unknown_blocks_check(target, PROMPT, plain, plain, longest=3) is None
