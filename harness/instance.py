"""A configuration of the sweep, typed: what one worker measures (plan.expand makes them). Its id hashes the fields
as plan.json keeps them, so committed runs keep their ids."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace

from harness.drafting import Drafting
from harness.engine import EngineConfig
from harness.sampling import Policy
from harness.specs import DraftSpec, NoDraft, parse_draft


@dataclass(frozen=True, eq=False)
class Instance:
    target: str
    draft: DraftSpec    # NoDraft() for the plain baseline
    gamma: int          # 0 for the baseline
    policy: Policy
    ngl: int
    ngl_draft: int
    threads: int
    adaptive: bool = False  # gamma chosen per step in 0..gamma by the cost model
    verify: str = "leviathan"  # how drafts are made and checked: drafting.Drafting
    p_min: float = 0.0
    n_min: int = 0
    cache_k: str = "f16"  # the target's KV cache types (the draft's below), llama.cpp's -ctk/-ctv
    cache_v: str = "f16"
    flash_attn: str = "auto"  # both models
    ubatch: int = 512  # both models
    cache_k_draft: str = "f16"
    cache_v_draft: str = "f16"
    parallel: int = 1  # requests decoded together, each its own sequence in the context (harness.concurrency)
    kv_unified: bool = False  # the sequences' KV in one buffer: llama.cpp then decodes an uneven batch in one graph

    @property
    def gamma_label(self) -> str:
        return f"auto<={self.gamma}" if self.adaptive else str(self.gamma)

    @property
    def drafting(self):
        return Drafting(self.verify, self.p_min, self.n_min)

    @property
    def draft_label(self) -> str:
        kv = (self.cache_k_draft, self.cache_v_draft)
        return self.drafting.label(str(self.draft), f"KV {kv[0]}/{kv[1]}" if kv != ("f16", "f16") else "")

    @property
    def baseline(self) -> bool:
        return self.draft.plain

    @property
    def setup(self) -> str:
        """The target's context settings where they are not the defaults, as the report names them ("" else)."""
        parts = [f"KV {self.cache_k}/{self.cache_v}" if (self.cache_k, self.cache_v) != ("f16", "f16") else "",
                 f"FA {self.flash_attn}" if self.flash_attn != "auto" else "",
                 f"ubatch {self.ubatch}" if self.ubatch != 512 else "",
                 f"parallel {self.parallel}" if self.parallel != 1 else "", "unified KV" if self.kv_unified else ""]
        return ", ".join(x for x in parts if x)

    def engine_config(self, n_ctx: int):
        return EngineConfig(n_ctx=n_ctx, n_gpu_layers=self.ngl, threads=self.threads, cache_k=self.cache_k,
                            cache_v=self.cache_v, flash_attn=self.flash_attn, n_ubatch=self.ubatch,
                            n_seq=self.parallel, kv_unified=self.kv_unified)

    def draft_engine_config(self, n_ctx: int):
        return replace(self.engine_config(n_ctx), n_gpu_layers=self.ngl_draft, cache_k=self.cache_k_draft,
                       cache_v=self.cache_v_draft)

    def plain(self) -> "Instance":
        """The plain baseline of this configuration's target, policy, offload, threads and context settings."""
        return Instance(self.target, NoDraft(), 0, self.policy, self.ngl, 0, self.threads, cache_k=self.cache_k,
                        cache_v=self.cache_v, flash_attn=self.flash_attn, ubatch=self.ubatch, parallel=self.parallel,
                        kv_unified=self.kv_unified)

    def to_dict(self) -> dict:
        """As plan.json, results.jsonl and a worker's arguments hold it: the draft a string, the policy a dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"draft": str(self.draft),
                                                                       "policy": self.policy.as_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Instance":
        return cls(**(d | {"draft": parse_draft(d["draft"]), "policy": Policy(**d["policy"])}))

    @property
    def id(self) -> str:
        # fields at their defaults stay out of the hash: a run from before a field existed keeps its ids
        d = {k: v for k, v in self.to_dict().items() if k not in LATER_DEFAULTS or v != LATER_DEFAULTS[k]}
        blob = json.dumps(d, sort_keys=True)
        tag = "base" if self.baseline else ("auto" if self.adaptive else f"g{self.gamma}")
        return f"{tag}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


# fields added after runs were first recorded: at their defaults they stay out of the id
LATER_DEFAULTS = {f.name: f.default for f in fields(Instance) if f.name in (
    "verify", "p_min", "n_min", "cache_k", "cache_v", "flash_attn", "ubatch", "cache_k_draft", "cache_v_draft",
    "parallel", "kv_unified")}
