"""concurrency.calibrate: the batched decode costs, measured with real sequences on SmolLM2."""
import pytest


def test_batched_costs_are_measured_with_real_sequences(engines):
    from harness.concurrency.calibrate import batched_costs, sequence_counts
    assert sequence_counts(8) == [1, 2, 4, 8] and sequence_counts(6) == [1, 2, 4, 6] and sequence_counts(1) == [1]
    target, draft = engines
    rec = batched_costs(target, draft, target.vocab.tokenize("The quick brown fox jumps over the lazy dog."), 3, 2,
                        context=32, reps=1)
    assert rec["seqs"] == [1, 2, 3] and rec["context"] == 32
    assert all(len(rec[k]) == 3 and all(x > 0 for x in rec[k])
               for k in ("plain_ms", "verify_ms", "draft_ms", "draft_catch_up_ms"))


@pytest.fixture(scope="module")
def engines(smol, smol_q2k):
    from harness.engine import Engine, EngineConfig
    cfg = EngineConfig(n_ctx=3 * 256, n_seq=3, threads=2)
    t, d = Engine(smol, cfg), Engine(smol_q2k, cfg)
    yield t, d
    t.close()
    d.close()
