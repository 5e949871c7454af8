"""How to run a recommended configuration outside the harness: llama-server's and llama-speculative-simple's
command lines for a draft model, llama-cpp-python's prompt lookup (and llama-server's ngram-simple) for an
n-gram proposer, llama-server's --spec-type with every flag of the type for llama.cpp's n-gram types
(specs.LlamaNgram; ngram-cache has none), and for the types only llama-server runs (specs.ServerType,
specs.Combined: a comma list).
Pure: it builds strings; nothing is run or loaded.

Flags are spelled as the llama.cpp vendored in llama-cpp-python 0.3.36 parses them (common/arg.cpp), each by
the first name arg.cpp lists; tests/data/llama_cpp_0.3.36_flags.txt holds that parser's flags.

- Every setting whose llama.cpp default differs from the harness's is passed explicitly: -ngl and
  --spec-draft-ngl (llama.cpp: auto, the harness: 0, the CPU), -c (llama.cpp: the model's own context),
  --spec-draft-n-max (llama.cpp: 3), the sampling flags (llama.cpp: top-k 40, top-p 0.95, min-p 0.05),
  llama-server's -np (llama.cpp: auto, 4 slots sharing one KV buffer). --spec-draft-p-min is passed even at
  its default (0 in this version) so that the behaviour does not hang on a version's default.
- --spec-type draft-simple is required: in this version a draft model alone (-md) leaves the speculative
  type at "none", and nothing is drafted.
- Threads 0 (the harness's physical cores) is left out: llama.cpp's own default is the physical cores too
  (common_cpu_get_num_math), and the command then fits the machine it runs on. Llama() then takes half the
  logical cores (all of them for batches).
- Model paths are those the harness loads (catalog.resolve: relative to the project root unless
  HARNESS_MODELS_DIR is absolute), or the name given where it does not resolve.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from harness.sampling import Policy
from harness.specs import Combined, LlamaNgram, ServerType

DEFAULT_UBATCH = 512  # llama.cpp's -ub default, and the harness's
PROMPT = '"$PROMPT"'  # llama-speculative-simple decodes one prompt: the user's, from the shell
# GGML type ids for Llama(type_k=..., type_v=...): ggml.h's enum (llama_cpp.py names all but bf16)
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}


@dataclass(frozen=True)
class HowTo:
    server: str | None  # llama-server's command line
    speculative_simple: str | None  # llama-speculative-simple's (a draft model only)
    python: str | None  # llama-cpp-python code (an n-gram proposer only: it has no draft-model speculation)
    note: str  # where llama.cpp's behaviour differs from what the harness measured ("" where it does not)


def model_path(ref: str, catalog: dict | None = None) -> str:
    """The file the harness loads for a catalog name or a path; the name itself where it does not resolve (no
    catalog at hand, an unknown name), so that a report still prints a command."""
    from harness.errors import HarnessError
    from harness.models.catalog import resolve
    try:
        return str(resolve(ref, catalog).path)
    except (HarnessError, OSError):
        return ref


def _num(x: float) -> str:
    return f"{x:g}"


def _sampling(pol: Policy) -> list[str]:
    if pol.greedy:
        return ["--temp", "0"]  # temp 0 is the argmax whatever the truncations keep
    return ["--temp", _num(pol.temperature), "--top-k", str(pol.top_k), "--top-p", _num(pol.top_p),
            "--min-p", _num(pol.min_p), "-s", str(pol.seed)]


def _context(target: str, inst, n_ctx: int) -> list[str]:
    args = ["-m", target, "-ngl", str(inst.ngl), "-c", str(n_ctx)]
    if inst.threads:
        args += ["-t", str(inst.threads)]
    if inst.cache_k != "f16":
        args += ["-ctk", inst.cache_k]
    if inst.cache_v != "f16":
        args += ["-ctv", inst.cache_v]
    if inst.flash_attn != "auto":  # llama.cpp's default is auto; the draft's context inherits it, as in the harness
        args += ["-fa", inst.flash_attn]
    if inst.ubatch != DEFAULT_UBATCH:
        args += ["-ub", str(inst.ubatch)]
    return args


def _draft_args(draft: str | None, inst) -> list[str]:
    """The draft context's flags (draft-simple's model, or a head's), without --spec-type; no model for draft-mtp
    on the target's own MTP layers."""
    args = (["--spec-draft-model", draft] if draft else []) + ["--spec-draft-n-max", str(inst.gamma),
                                                               "--spec-draft-p-min", _num(inst.p_min)]
    if inst.n_min:  # llama.cpp's default is 0, as the harness's
        args += ["--spec-draft-n-min", str(inst.n_min)]
    args += ["--spec-draft-ngl", str(inst.ngl_draft)]
    if inst.threads:  # the draft runs on the target's threads in the harness; llama.cpp's default is the same
        args += ["--spec-draft-threads", str(inst.threads)]
    if inst.cache_k_draft != "f16":
        args += ["--spec-draft-type-k", inst.cache_k_draft]
    if inst.cache_v_draft != "f16":
        args += ["--spec-draft-type-v", inst.cache_v_draft]
    return args


def _type_args(draft, inst, catalog) -> list[str]:
    """One llama.cpp type's own flags: an n-gram type's every flag (defaults too, as the harness ran them), a draft
    model's or head's draft context; none for ngram-cache (it drafts up to 8 tokens)."""
    if isinstance(draft, LlamaNgram):
        return [x for k, v in draft.params for x in (f"--spec-{draft.kind}-{k}", str(v))]
    if draft.model:
        return _draft_args(model_path(draft.model, catalog), inst)
    if isinstance(draft, ServerType):
        return _draft_args(draft.head and model_path(draft.head, catalog), inst)
    return []


def _python(target: str, inst, n_ctx: int) -> str:
    pol = inst.policy
    kw = [f"model_path={target!r}", f"n_ctx={n_ctx}", f"n_gpu_layers={inst.ngl}"]
    if inst.threads:
        kw += [f"n_threads={inst.threads}", f"n_threads_batch={inst.threads}"]
    if inst.ubatch != DEFAULT_UBATCH:
        kw.append(f"n_ubatch={inst.ubatch}")
    if inst.flash_attn != "auto":
        kw.append(f"flash_attn={inst.flash_attn == 'on'}")
    for key, t in (("type_k", inst.cache_k), ("type_v", inst.cache_v)):
        if t != "f16":
            kw.append(f"{key}={GGML_TYPES[t]}")
    kw.append(f"draft_model=LlamaPromptLookupDecoding(max_ngram_size={inst.draft.ngram}, "
              f"num_pred_tokens={inst.gamma})")
    samp = ("temperature=0.0" if pol.greedy else f"temperature={pol.temperature!r}, top_k={pol.top_k}, "
            f"top_p={pol.top_p!r}, min_p={pol.min_p!r}, seed={pol.seed}")
    lines = ["from llama_cpp import Llama", "from llama_cpp.llama_speculative import LlamaPromptLookupDecoding", ""]
    if inst.flash_attn == "auto":
        lines.append("# flash attention: Llama() takes on or off only (default off); the harness ran llama.cpp's auto")
    lines += ["llm = Llama(" + ", ".join(kw) + ")", f"out = llm.create_completion(PROMPT, max_tokens=None, {samp})"]
    return "\n".join(lines)


def howto(inst, n_ctx: int, catalog: dict | None = None) -> HowTo:
    """The commands that run a configuration of the plan (instance.Instance) at the run's n_ctx, with the harness's
    settings of the same names."""
    pol, draft, gamma = inst.policy, inst.draft, inst.gamma
    tpath = model_path(inst.target, catalog)
    server = ["llama-server", *_context(tpath, inst, n_ctx), "-np", str(inst.parallel),
              *(["-kvu"] if inst.kv_unified else [])]
    notes = []
    if inst.adaptive:
        notes.append(f"llama.cpp has no adaptive draft length: {gamma}, the harness's longest, is fixed here.")
    if draft.plain:
        return HowTo(shlex.join(server + _sampling(pol)), None, None, "plain decoding: no speculative flags.")
    if n := draft.ngram:
        # llama-server's ngram-simple: the latest earlier match of the last n tokens, as the harness's lookup
        server += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n),
                   "--spec-ngram-simple-size-m", str(gamma)]
        # a lookup's draft is a point mass: llama.cpp's rule accepts it as Leviathan's does, with p(x)
        notes += [f"llama-server's ngram-simple drops a continuation shorter than {n} tokens.",
                  f"LlamaPromptLookupDecoding tries n-grams from {n} down to 1 and takes the earliest match; the "
                  f"harness takes the latest match of exactly {n}."]
        return HowTo(shlex.join(server + _sampling(pol)), None, _python(tpath, inst, n_ctx), " ".join(notes))
    if draft.server_only:  # llama-server alone runs these: its comma list of types, each part's flags
        parts = draft.parts if isinstance(draft, Combined) else (draft,)
        server += ["--spec-type", draft.server_type, *(x for d in parts for x in _type_args(d, inst, catalog))]
        if isinstance(draft, Combined):
            notes.append("llama-server drafts each step with the first of these types that finds a draft.")
        return HowTo(shlex.join(server + _sampling(pol)), None, None, " ".join(notes))
    if isinstance(draft, LlamaNgram):  # every flag of the type, defaults too, as the harness ran them
        server += ["--spec-type", draft.kind, *_type_args(draft, inst, catalog)]
        if draft.kind != "ngram-simple":  # the others keep state from request to request
            notes.append(f"llama-server keeps {draft.kind}'s state from request to request for as long as it runs; "
                         "the harness kept it across one configuration's prompts, as one server per configuration.")
        return HowTo(shlex.join(server + _sampling(pol)), None, None, " ".join(notes))
    spec = ["--spec-type", "draft-simple", *_draft_args(model_path(draft.model, catalog), inst)]
    simple = ["llama-speculative-simple", *_context(tpath, inst, n_ctx), *spec, *_sampling(pol)]
    if rule_differs(inst):
        # common_sampler_sample_and_accept_n: the target samples each position, the draft token stays if equal
        notes.append("The harness's figure is Leviathan's rule; llama.cpp keeps a draft token only when the target "
                     "samples it (the harness's \"exact\" rule, which usually accepts less): the exact figure "
                     "carries over.")
    if inst.parallel > 1:
        notes.append(f"llama-speculative-simple decodes one sequence; llama-server's -np {inst.parallel} is the "
                     "harness's parallel requests.")
    return HowTo(shlex.join(server + spec + _sampling(pol)), shlex.join(simple) + f" -p {PROMPT}", None,
                 " ".join(notes))


def rule_differs(inst) -> bool:
    """Whether llama.cpp would verify this configuration by another rule than the harness measured: a sampled
    draft model under Leviathan's rule (a lookup's point-mass draft is accepted alike by both)."""
    return not inst.policy.greedy and inst.verify == "leviathan" and inst.draft.model is not None
