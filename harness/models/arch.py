"""What a GGUF's architecture means for speculative decoding, from its header alone (header.py), as the llama.cpp
that llama-cpp-python 0.3.36 vendors sees it (src/llama-arch.cpp, src/llama-model.cpp):
- its memory: a KV cache, recurrent state (llm_arch_is_recurrent), or both (llm_arch_is_hybrid). The harness rolls
  a rejected draft back with llama_memory_seq_rm on a position range; llama_memory_recurrent::seq_rm refuses a
  partial range unless the context keeps state snapshots (n_rs_seq, which only llm_arch_supports_rs_rollback's
  architectures take, and which the harness does not set). Such a model is refused before it loads;
  llama-server speculates on it with state checkpoints instead.
- mixture of experts: `<arch>.expert_count`, `<arch>.expert_used_count` (per layer where it is an array), and
  the parameters a token touches: the routed experts' tensors (`blk.N.*_exps`) scaled by used / count.
- heads for speculation: `<arch>.nextn_predict_layers` (MTP, llama-server's draft-mtp); a file whose architecture
  is eagle3 or dflash is itself a head that drafts for another model (draft-eagle3, draft-dflash)."""
from __future__ import annotations

from pathlib import Path

from harness.errors import HarnessError
from harness.models.header import Header, Unreadable, read_header

# llama-arch.cpp: llm_arch_is_recurrent, llm_arch_is_hybrid, llm_arch_supports_rs_rollback (the names of
# LLM_ARCH_NAMES); test_arch checks them against the source where it is at hand
RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID = frozenset({"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
                    "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35",
                    "qwen35moe", "qwen4exp", "deepseek4", "minimax-01"})
RS_ROLLBACK = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
                         "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})
HEADS = {"eagle3": ("EAGLE-3", "draft-eagle3"), "dflash": ("DFlash", "draft-dflash")}


def _int(v) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def facts(h: Header) -> dict:
    """The architecture's facts, JSON-serialisable: its name, memory ("kv cache", "recurrent" or "hybrid"), experts
    (0: dense), experts used per token (the most of any layer), parameters in the file and active per token, MTP
    layers, and the head it is (EAGLE-3, DFlash) or None."""
    arch = h.kv.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    experts = _int(h.kv.get(f"{arch}.expert_count"))
    key = f"{arch}.expert_used_count"
    used = [_int(x) for x in h.arrays[key]] if key in h.arrays else [_int(h.kv.get(key))]
    active = h.params
    if experts:  # a layer's routed experts count for the share of them a token uses
        for layer, n in h.expert_params.items():
            u = used[layer] if len(used) > 1 and layer < len(used) else used[0]
            active -= n - n * min(u, experts) // experts
    memory = "recurrent" if arch in RECURRENT else "hybrid" if arch in HYBRID else "kv cache"
    return {"architecture": arch, "memory": memory, "experts": experts, "experts_used": max(used) if experts else 0,
            "params": h.params, "active_params": active, "mtp_layers": _int(h.kv.get(f"{arch}.nextn_predict_layers")),
            "head": HEADS[arch][0] if arch in HEADS else None}


def read(path: Path) -> dict:
    try:
        return facts(read_header(Path(path)))
    except Unreadable as e:
        raise HarnessError(f"{path}: {e}") from None


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def words(f: dict) -> str:
    """'dense, 135M parameters in the file' (its tensors' elements: a tied output layer stored twice counts
    twice); 'hybrid (recurrent and attention layers) 'qwen3next', MoE: 512 experts, 10 used
    per token, 3.9B of 80.0B parameters active; MTP heads (1 layer)'; 'an EAGLE-3 head'."""
    if f.get("head"):
        return f"an {f['head']} head ({f['architecture']}: it drafts for another model)"
    mem = {"recurrent": f"recurrent '{f['architecture']}', ", "hybrid": f"hybrid (recurrent and attention layers) "
           f"'{f['architecture']}', "}.get(f["memory"], "")
    kind = (f"MoE: {f['experts']} experts, {f['experts_used']} used per token, {_count(f['active_params'])} of "
            f"{_count(f['params'])} parameters active" if f["experts"] else
            f"dense, {_count(f['params'])} parameters in the file")
    mtp = f"; MTP heads ({f['mtp_layers']} layer{'s' * (f['mtp_layers'] > 1)})" if f["mtp_layers"] else ""
    return mem + kind + mtp


def implications(f: dict) -> list[str]:
    """What the facts mean for the answer, one sentence each (nothing for a dense model without heads)."""
    out = []
    if f["experts"]:
        out.append("A block of draft tokens routes to more experts than one token does, so verifying it costs more "
                   "than on a dense model of the same active size (mlx-lm#1132, ik_llama.cpp#1630): speculation "
                   "gains less here.")
    if f["mtp_layers"]:
        out.append("It carries MTP heads: llama-server's `--spec-type draft-mtp` drafts with them and is the first "
                   "thing to try; this harness does not run them.")
    return out


def refusal(name: str, f: dict) -> str | None:
    """Why the harness's loop cannot run this model, in one line; None where it can."""
    arch = f["architecture"]
    if f.get("head"):
        return (f"{name}: an {f['head']} head ('{arch}'), which drafts for another model through llama-server's "
                f"`--spec-type {HEADS[arch][1]}`; the harness runs it neither as a target nor as a draft")
    if f["memory"] == "kv cache":
        return None
    kind = "a recurrent" if f["memory"] == "recurrent" else "a hybrid (recurrent and attention)"
    snap = (" (llama.cpp keeps per-token state snapshots for it with n_rs_seq, which the harness does not set)"
            if arch in RS_ROLLBACK else "")
    return (f"{name}: {kind} architecture '{arch}': its state cannot be rolled back to an earlier position "
            f"(llama_memory_seq_rm on a partial range), which speculative verification needs{snap}; llama-server "
            "speculates on it with state checkpoints: measure it there")


def require_rollback(models: dict[str, Path]) -> None:
    """Refuse, before any model loads, a model (name -> path) whose state the harness's loop cannot roll back."""
    for name, path in models.items():
        if why := refusal(f"{name} ({path})" if str(path) != name else name, read(path)):
            raise HarnessError(why)


def require_head(kind: str, target: Path, head: Path | None) -> None:
    """Refuse, in one line, a llama-server drafting head (specs.ServerType) that its file does not carry: draft-mtp
    needs MTP layers (`<arch>.nextn_predict_layers`) in the head given, or else in the target; draft-eagle3 and
    draft-dflash a file of that architecture."""
    path = head or target
    if head is not None and not Path(head).is_file():
        what = "not a file (a folder, FIFO or device)" if Path(head).exists() else "no such file"
        raise HarnessError(f"--draft {kind}:{head}: {what}: give the path of the head's GGUF")
    f = read(path)
    want = {"draft-eagle3": "eagle3", "draft-dflash": "dflash"}.get(kind)
    if want and f["architecture"] != want:
        raise HarnessError(f"--draft {kind}: {path} is a '{f['architecture']}' model, not the '{want}' head {kind} "
                           f"drafts with: give the {HEADS[want][0]} GGUF trained for the target")
    if kind == "draft-mtp" and not f["mtp_layers"]:
        where = "the head given" if head else "the target"
        raise HarnessError(f"--draft draft-mtp: {path} ({where}) carries no MTP layers "
                           f"({f['architecture']}.nextn_predict_layers): give draft-mtp:SIDECAR.gguf with them, or "
                           "another type")
