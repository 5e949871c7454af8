"""GGUFDraft: a second GGUF as the draft model of llama-cpp-python's own speculative decoding,
`Llama("target.gguf", draft_model=GGUFDraft("draft.gguf"))`.

llama-cpp-python 0.3.36 ships prompt lookup only, but its generate loop takes any LlamaDraftModel: each step it
calls the draft with every token so far, evaluates the returned tokens in one batch beside the last one, samples
each position with the target's own sampler and keeps the drafts while the samples match (sample and compare:
the output follows the target's distribution, whatever the draft proposes). GGUFDraft proposes as llama.cpp's
draft-simple does: up to n_max tokens, greedily, stopping where the draft's top token holds less than p_min of
its top 10, and none at all where fewer than n_min remain: the harness loop's own rule (proposers.draft_pick,
drafting.Drafting).

Its context follows the target's tokens: each call keeps the longest common prefix with what it holds (the
accepted drafts included), drops the rest from its KV cache and evaluates only the new tokens, so a prompt is
evaluated once and a step costs the draft its new tokens and its drafts."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from harness.drafting import Drafting, Proposal
from harness.engine import Engine, EngineConfig
from harness.proposers import draft_pick
from harness.sampling import Policy


class GGUFDraft(LlamaDraftModel):
    """A draft GGUF for `Llama(..., draft_model=GGUFDraft(path))`. n_max, n_min and p_min are llama.cpp's
    --spec-draft-n-max, --spec-draft-n-min and --spec-draft-p-min, with the defaults of the llama.cpp that
    llama-cpp-python 0.3.36 vendors (3, 0, 0). Where the target's tokens outgrow n_ctx it drafts nothing, and
    the target decodes plainly."""

    def __init__(self, model_path: str | Path, n_max: int = 3, n_min: int = 0, p_min: float = 0.0, *,
                 n_threads: int = 0, n_gpu_layers: int = 0, n_ctx: int = 2048, type_k: str = "f16",
                 type_v: str = "f16"):
        if n_max < 1 or not 0 <= n_min <= n_max or not 0.0 <= p_min <= 1.0:
            raise ValueError(f"GGUFDraft: need n_max >= 1, 0 <= n_min <= n_max and 0 <= p_min <= 1 (got n_max "
                             f"{n_max}, n_min {n_min}, p_min {p_min})")
        self.path = Path(model_path)
        self.n_max = n_max
        self.drafting = Drafting(verify="exact", p_min=p_min, n_min=n_min)  # exact: the top token, no sampling
        self.engine = Engine(self.path, EngineConfig(n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, threads=n_threads,
                                                     cache_k=type_k, cache_v=type_v))
        self._held: list[int] = []  # the tokens in the draft's KV cache, in order
        self.evaluated = 0  # tokens the draft has evaluated: its prompt, the targets' new tokens, its drafts

    def check(self, target: Any) -> dict:
        """The harness's alignment check of this draft against `target` (a llama_cpp.Llama or a GGUF path): a
        HarnessError in one line where their vocabularies do not align (the drafts would be rejected, or
        mistranslated), or where a Llama's logits buffer is too short for a draft model; else the check's
        report."""
        from harness.align import require_aligned
        from harness.errors import HarnessError
        scores = getattr(target, "scores", None)
        if scores is not None and len(scores) < target.n_ctx():
            # llama-cpp-python 0.3.36 sizes it by the logits_all argument, though a draft model needs every row
            raise HarnessError(f"the target's logits buffer holds {len(scores)} rows of its n_ctx {target.n_ctx()}: "
                               "a draft model fails past them in llama-cpp-python 0.3.36; give Llama(..., "
                               "logits_all=True)")
        return require_aligned(Path(getattr(target, "model_path", target)), self.path)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        ids = [int(t) for t in input_ids]
        if not ids or len(ids) + self.n_max > self.engine.n_ctx:
            return np.array([], dtype=np.intc)
        keep = 0
        for a, b in zip(self._held, ids[:-1]):  # the last token is evaluated anew: its logits start the draft
            if a != b:
                break
            keep += 1
        self.engine.trim(keep)
        row = self._decode(ids[keep:], keep)
        prop = Proposal()
        while (picked := draft_pick(row, Policy(), self.drafting, None)) is not None:
            prop.tokens.append(picked[0])
            if len(prop.tokens) == self.n_max:
                break
            row = self._decode(prop.tokens[-1:], len(self._held))
        return np.array(self.drafting.kept(prop).tokens, dtype=np.intc)

    def _decode(self, tokens: list[int], at: int) -> np.ndarray:
        """tokens appended after the first `at` held ones; the last one's logits."""
        row = self.engine.decode(tokens, "last")[-1]
        self._held = self._held[:at] + tokens
        self.evaluated += len(tokens)
        return row

    def close(self) -> None:
        self.engine.close()
