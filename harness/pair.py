"""Opening a target and a proposer for a run: resolve, check presence, offload and alignment, load."""
from __future__ import annotations

from dataclasses import dataclass, replace

from harness import llamangram
from harness.drafting import Drafting
from harness.engine import Engine, EngineConfig
from harness.llamacpp import require_offload
from harness.models.arch import require_rollback
from harness.models.catalog import Model, require_present, resolve
from harness.promptcache import PromptCache
from harness.proposers import DraftModelProposer, EachSequence, NgramProposer
from harness.specs import DraftSpec, LlamaNgram


@dataclass
class Pair:
    target_model: Model
    target: Engine
    proposer: object | None = None
    draft_model: Model | None = None
    draft_engine: Engine | None = None
    alignment: dict | None = None
    prompt_cache: PromptCache | None = None  # the run's, for the target's prompts (the draft's proposer has it)

    def close(self) -> None:
        if self.draft_engine:
            self.draft_engine.close()
        self.target.close()


def open_pair(target_ref: str, draft: DraftSpec, cfg: EngineConfig, draft_cfg: EngineConfig | None = None,
              check_texts: list | None = None, check_alignment: bool = True, drafting: Drafting = Drafting(),
              prompt_cache: PromptCache | None = None) -> Pair:
    """Everything that can be refused is refused before any weights are loaded. draft_cfg: the draft's
    context (default: the target's, on the CPU). prompt_cache: the run's, for both models' prompts."""
    draft_cfg = draft_cfg or replace(cfg, n_gpu_layers=0)
    tm = resolve(target_ref)
    require_present(tm)
    require_offload(cfg.n_gpu_layers, "--ngl")
    dm, alignment, ngram = None, None, draft.ngram
    if draft.model:
        dm = resolve(draft.model)
        require_present(dm)
    if not draft.plain:  # a rejected draft is rolled back, in both models
        require_rollback({m.name: m.path for m in (tm, dm) if m})
    if dm:
        from harness.align import require_aligned
        require_offload(draft_cfg.n_gpu_layers, "--ngl-draft")
        if check_alignment:
            alignment = require_aligned(tm.path, dm.path, check_texts)
    target = Engine(tm.path, cfg)
    pair = Pair(tm, target, draft_model=dm, alignment=alignment, prompt_cache=prompt_cache)
    if ngram is not None:
        pair.proposer = EachSequence(lambda: NgramProposer(ngram))
    elif isinstance(draft, LlamaNgram):  # llama.cpp's n-gram types, ported
        pair.proposer = EachSequence(lambda: llamangram.proposer(draft))
    elif dm is not None:
        try:
            pair.draft_engine = Engine(dm.path, draft_cfg)
        except BaseException:
            target.close()
            raise
        pair.proposer = DraftModelProposer(pair.draft_engine, dm.name, drafting, prompt_cache)
    return pair
