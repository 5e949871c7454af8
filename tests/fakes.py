"""Scripted stand-ins for a llama.cpp target and a proposer: exact control over what each says, no model."""
import numpy as np

from harness.drafting import Proposal
from harness.sampling import Dist

EOS, V = 0, 16


class FakeVocab:
    def is_eog(self, t):
        return t == EOS

    def detokenize(self, toks):
        return " ".join(map(str, toks))


class FakeEngine:
    """A greedy target: its choice at output position i is script[i]. `batched`, when given, maps a position to
    what it chooses there when that position is evaluated inside a block of more than one token (llama.cpp's
    batched kernels), with the top-2 logit margin `margin`: a kernel near-tie."""

    def __init__(self, prompt_len, script, batched=None, margin=0.119):
        self.prompt_len, self.script, self.batched, self.margin = prompt_len, script, batched or {}, margin
        self.vocab, self.ctx = FakeVocab(), []

    @property
    def n_past(self):
        return len(self.ctx)

    def reset(self):
        self.ctx = []

    def perf_reset(self):
        pass

    def perf(self):
        return {"eval_ms": 0.0, "n_eval": 0}

    def decode(self, tokens, logits="last"):
        self.ctx += list(tokens)
        if logits == "none":
            return None
        rows = range(len(self.ctx) - len(tokens), len(self.ctx)) if logits == "all" else [len(self.ctx) - 1]
        out = np.full((len(rows), V), -10.0, dtype=np.float32)
        for i, r in enumerate(rows):
            pos = r + 1 - self.prompt_len
            single = self.script[pos]
            chosen = self.batched.get(pos, single) if len(tokens) > 1 else single
            out[i, single] = 10.0 if chosen == single else 10.0 - self.margin
            out[i, chosen] = 10.0
            if chosen == single:
                out[i, (single + 1) % V] = 10.0 - self.margin  # the runner-up, near either way
        return out

    def trim(self, n):
        del self.ctx[n:]

    # the loop's batch API, over sequence 0 alone
    def prefill(self, tokens, seq=0):
        self.seq_trim(seq, 0)
        self.decode(tokens, logits="none")

    def seq_trim(self, seq, n):
        assert seq == 0, "a fake of one sequence"
        self.trim(n)

    def decode_rows(self, rows):
        """Rows of sequence 0 at consecutive positions from its end: decode()'s block, the wanted rows kept."""
        assert all(seq == 0 for seq, *_ in rows) and [r[1] for r in rows] == list(range(len(self.ctx),
                                                                                          len(self.ctx) + len(rows)))
        out = self.decode([r[2] for r in rows], logits="all")
        return out[[i for i, r in enumerate(rows) if r[3]]]


def logits_row(weights: dict[int, float]) -> np.ndarray:
    """Logits whose softmax is weights (normalised) on their ids, every other id -inf."""
    row = np.full(V, -np.inf, dtype=np.float32)
    for t, w in weights.items():
        row[t] = np.log(w)
    return row


class LogitsEngine(FakeEngine):
    """A sampling model: its logits at output position i are rows[i] whatever the context, so what each
    position's processed distribution is can be worked out by hand. As a draft, give it to DraftModelProposer."""

    def __init__(self, prompt_len, rows: list[dict[int, float]]):
        super().__init__(prompt_len, [])
        self.rows = np.stack([logits_row(w) for w in rows])

    def decode(self, tokens, logits="last"):
        self.ctx += list(tokens)
        if logits == "none":
            return None
        first = len(self.ctx) - (len(tokens) if logits == "all" else 1)
        return self.rows[first + 1 - self.prompt_len:len(self.ctx) + 1 - self.prompt_len]


class ScriptedProposer:
    """Proposes tokens[pos:pos + n] at output position pos."""
    name = "script"

    def __init__(self, prompt_len, tokens):
        self.prompt_len, self.tokens = prompt_len, tokens

    def prefill(self, prompt, policy):
        pass

    def propose(self, context, n):
        pos = len(context) - self.prompt_len
        toks = self.tokens[pos:pos + n]
        return Proposal(toks, [Dist.point(t) for t in toks])

    def accepted(self, context, n):
        pass
