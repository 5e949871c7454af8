"""Why a greedy speculative output left plain greedy decoding: evidence, not a fixed logit margin.

llama.cpp evaluates a verification block (several tokens in one batch) with other kernels than a single-token
decode, and the two round differently; where the target's top two logits are close, its argmax can differ
between them. At the first divergence the target is re-evaluated both ways, each path replayed exactly as the
loop ran it (the plain one token at a time; the speculative one in blocks of the sizes its steps used, the
block holding that position last): if the two argmaxes differ, the kernels explain the divergence (a kernel
near-tie); if they agree, the speculative output holds a token the target does not choose (a mismatch: a bug
to investigate). Where several sequences decoded together, the batch's size picks the kernels: each replayed
decode shares its batch with as many filler sequences as shared the step."""
from __future__ import annotations

import numpy as np


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ, or where the shorter one ended; None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def blocks(records: list[dict]) -> list[tuple[int, int, int]]:
    """A generation's steps as (proposed, emitted, others), from its trace records: the block sizes to replay,
    and how many other sequences shared the step's batch (0 when it decoded alone)."""
    return [(r["proposed"], r["emitted"], r.get("active", 1) - 1) for r in records if r.get("type") == "step"]


def _decode(engine, tokens: list[int], others: int) -> np.ndarray:
    """All rows' logits of tokens appended to sequence 0, in a batch where `others` more sequences each decode
    as many filler rows (removed again). llama.cpp splits a batch of several sequences into equal shares of
    each, so this is the batch a step of equal blocks ran in, and the kernels its size picks."""
    if not others:
        return engine.decode(tokens, logits="all")
    rows = [(0, engine.n_past + i, t, True) for i, t in enumerate(tokens)]
    rows += [(seq, i, t, False) for seq in range(1, others + 1) for i, t in enumerate(tokens)]
    logits = engine.decode_rows(rows)
    for seq in range(1, others + 1):
        engine.seq_trim(seq, 0)
    return logits


def margin(row: np.ndarray) -> float:
    """Top-1 minus top-2 logit: how close the target's choice was to a tie."""
    a = int(np.argmax(row))
    second = max(row[:a].max(initial=-np.inf), row[a + 1:].max(initial=-np.inf))
    return float(row[a] - second)


def _plain_row(engine, prompt: list[int], out: list[int], at: int, others: list[int] | None = None) -> np.ndarray:
    """The target's logits for output position `at`, decoded one token at a time as plain decoding does (others:
    how many other sequences shared each plain step's batch)."""
    engine.reset()
    engine.decode(prompt[:-1], logits="none")
    ctx = [prompt[-1], *out[:at]]
    others = others or []
    for i, t in enumerate(ctx[:-1]):
        _decode(engine, [t], others[i] if i < len(others) else 0)
    return np.array(_decode(engine, [ctx[-1]], others[at] if at < len(others) else 0)[0])


def _block_row(engine, prompt: list[int], out: list[int], blocks: list[tuple[int, int]], at: int):
    """The same position inside the verification block that covered it: every earlier step replayed with its
    block size (rows after the kept ones change nothing before them: attention is causal, and only the batch
    size picks the kernel). Returns (logits row, block length), or None when the steps do not reach `at`."""
    engine.reset()
    engine.decode(prompt[:-1], logits="none")
    pos = 0
    for i, (proposed, emitted, *others) in enumerate(blocks):
        fill = out[pos:pos + proposed]
        fill = fill + [fill[-1] if fill else prompt[-1]] * (proposed - len(fill))
        ctx_last = prompt[-1] if pos == 0 else out[pos - 1]
        logits = _decode(engine, [ctx_last, *fill], others[0] if others else 0)
        # a step covers the positions it emitted; the last one also the end-of-generation token it chose
        if pos <= at < pos + emitted + (i == len(blocks) - 1):
            return np.array(logits[at - pos]), proposed + 1
        pos += emitted
        engine.trim(len(prompt) + pos - 1)
    return None


def kernel_check(engine, prompt: list[int], spec_out: list[int], blocks: list[tuple], plain_out: list[int],
                 plain_others: list[int] | None = None) -> dict | None:
    """Classify the first divergence of a greedy speculative output (spec_out, produced in steps of
    (proposed, emitted[, other sequences]) tokens) from plain greedy decoding (plain_out; plain_others: the other
    sequences in each of its steps) of the same prompt on this engine's model. None when the outputs are equal."""
    at = first_divergence(spec_out, plain_out)
    if at is None:
        return None
    plain = _plain_row(engine, prompt, plain_out, at, plain_others)
    found = _block_row(engine, prompt, spec_out, blocks, at)
    engine.reset()
    rec = {"diverged_at": at, "margin": round(margin(plain), 5), "plain_argmax": int(np.argmax(plain))}
    if found is None:
        return rec | {"kind": "unchecked", "why": "the speculative steps do not reach the divergence"}
    row, block_len = found
    rec |= {"block_argmax": int(np.argmax(row)), "block_len": block_len}
    return rec | {"kind": "kernel near-tie" if rec["block_argmax"] != rec["plain_argmax"] else "mismatch"}


def unknown_blocks_check(engine, prompt: list[int], spec_out: list[int], plain_out: list[int],
                         longest: int) -> dict | None:
    """kernel_check for a server's output, whose verification blocks are not known (llama-server does not report
    its steps): at the first divergence the plain row is re-evaluated one token at a time, then the same position
    at every offset of every block size a step could have used (2 to longest + 1 rows, up to 9), the context
    before each block decoded one token at a time. A kernel near-tie where one of these evaluations chooses the
    speculative token (the plain one included: the server's kernels, threads and build round apart from this
    process's). Where none does, unchecked rather than a mismatch: the server's own kernels decided it, and they
    are not reproduced here (the margin says how near the tie was). None when the outputs are equal."""
    at = first_divergence(spec_out, plain_out)
    if at is None:
        return None
    plain = _plain_row(engine, prompt, plain_out, at)
    rec = {"diverged_at": at, "margin": round(margin(plain), 5), "plain_argmax": int(np.argmax(plain))}
    if at >= len(spec_out):
        engine.reset()
        return rec | {"kind": "unchecked", "why": "the speculative output ended there"}
    if rec["plain_argmax"] == spec_out[at]:
        engine.reset()
        return rec | {"kind": "kernel near-tie", "block_argmax": rec["plain_argmax"], "block_len": 1}
    ctx = [prompt[-1], *spec_out[:at + 1]]  # rows: the token before each position, then the speculative one
    engine.reset()
    engine.decode(prompt[:-1], logits="none")
    for t in ctx[:at]:  # the context one token at a time, as plain decoding built it; trimmed back per block
        engine.decode([t], logits="none")
    base, top = len(prompt) - 1, min(longest + 1, 9)
    for first in range(at, max(at - top, -1), -1):  # `at`'s row is the block's row at - first
        engine.trim(base + first)
        for k in range(max(2, at - first + 1), top + 1):
            fill = ctx[first:first + k]
            got = int(np.argmax(engine.decode(fill + [fill[-1]] * (k - len(fill)), logits="all")[at - first]))
            engine.trim(base + first)
            if got == spec_out[at]:
                engine.reset()
                return rec | {"kind": "kernel near-tie", "block_argmax": got, "block_len": k}
    engine.reset()
    return rec | {"kind": "unchecked", "block_argmax": None, "block_len": None,
                  "why": f"no evaluation here (one token, blocks of 2 to {top} rows) chooses the speculative "
                         "token: llama-server's own kernels decided it"}
