"""bench.probe: the figures the time estimate starts from, a model's probe (kept while recent) and each
prompt's tokens."""
import pytest

from harness.bench.probe import Figures, Probe
from harness.prompts import Prompt


T, T2, D = "target-model", "other-target", "draft-model"


# ms, keyed (model, threads, ngl): a prompt token, one decode (neither growing with the context), a further token
# of a block (so a block of k costs 30 + 10 (k - 1) for the target, 10 + 2 (k - 1) for the draft)
PROBES = {(T, 2, 0): Probe(5.0, 0.0, 30.0, 0.0, 10.0), (T2, 2, 0): Probe(5.0, 0.0, 30.0, 0.0, 10.0),
          (D, 2, 0): Probe(2.0, 0.0, 10.0, 0.0, 2.0)}


def test_costs_grow_with_the_tokens_cached():
    p = Probe(5.0, 0.01, 30.0, 0.02, 10.0)
    assert p.prompt(100) == pytest.approx(100 * (5 + 0.01 * 50))  # positions 0..99, 50 on average
    assert p.prompt(32, start=100) == pytest.approx(32 * (5 + 0.01 * 116))
    assert p.blocks(3, 500) == pytest.approx([40, 50, 60])


def test_prompts_are_counted_in_their_targets_own_tokens_once(smol, monkeypatch):
    import harness.llamacpp as llamacpp
    from harness.llamacpp import Vocab, load_model
    t = "smollm2-135m-instruct-q4_1"
    ps = [Prompt("a", "code", messages=(("user", "Write a function that reverses a list."),)),
          Prompt("b", "code", text="def add(a, b):\n    return a + b\n" * 20, chat=False)]
    v = Vocab(load_model(smol, vocab_only=True))
    loads = []
    monkeypatch.setattr(llamacpp, "load_model", lambda *a, **k: loads.append(a) or load_model(*a, **k))
    fig = Figures()
    assert [fig.tokens(t, p) for p in ps * 2] == [len(v.tokenize(p.render(v))) for p in ps * 2]
    assert len(loads) == 1  # the target's vocabulary, once
    assert fig.tokens(t, ps[0]) > len(v.tokenize(ps[0].messages[0][1]))  # the chat template's tokens count too


def test_a_recent_probe_is_kept_and_a_stale_or_changed_one_taken_again(tmp_path, monkeypatch):
    import json
    import os
    import types

    import harness.bench.probe as est
    import harness.models.catalog as catalog
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(catalog, "resolve", lambda ref: types.SimpleNamespace(path=model))
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    timed = []
    monkeypatch.setattr(est, "probe", lambda ref, threads, ngl: timed.append((threads, ngl)) or PROBES[(T, 2, 0)])
    fig = Figures()
    assert fig.probe(T, 2, 0) == PROBES[(T, 2, 0)] and timed == [(2, 0)] and fig.ages == {}
    assert "kept" not in fig.source()
    again = Figures()  # the next run, moments later: the same figures, not timed again, and it says so
    assert again.probe(T, 2, 0) == PROBES[(T, 2, 0)] and len(timed) == 1
    assert "(1 of them under a minute ago, kept)" in again.source()
    Figures().probe(T, 1, 0)  # other threads: another probe
    assert len(timed) == 2
    cache = tmp_path / "cache" / "probes.json"
    old = {k: v | {"at": v["at"] - est.PROBE_TTL_S - 1} for k, v in json.loads(cache.read_text()).items()}
    cache.write_text(json.dumps(old))  # too old
    Figures().probe(T, 2, 0)
    assert len(timed) == 3
    os.utime(model, ns=(0, 0))  # the model file replaced
    Figures().probe(T, 2, 0)
    assert len(timed) == 4
    cache.write_text("not json")  # a damaged cache is no cache
    Figures().probe(T, 2, 0)
    assert len(timed) == 5 and json.loads(cache.read_text())
