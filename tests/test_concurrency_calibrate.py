"""concurrency.calibrate: the batched decode costs, measured with real sequences on SmolLM2."""


def test_batched_costs_are_measured_with_real_sequences(smol_slots):
    from harness.concurrency.calibrate import batched_costs, sequence_counts
    assert sequence_counts(8) == [1, 2, 4, 8] and sequence_counts(6) == [1, 2, 4, 6] and sequence_counts(1) == [1]
    target, draft = smol_slots
    rec = batched_costs(target, draft, target.vocab.tokenize("The quick brown fox jumps over the lazy dog."), 3, 2,
                        context=32, reps=1)
    assert rec["seqs"] == [1, 2, 3] and rec["context"] == 32
    assert all(len(rec[k]) == 3 and all(x > 0 for x in rec[k])
               for k in ("plain_ms", "verify_ms", "draft_ms", "draft_catch_up_ms"))

