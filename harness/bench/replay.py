"""The replay worker: for one target, offload, threads and policy, the plain baseline's outputs (which the sweep
ran anyway) are teacher-forced through the target and each draft model, once per prompt; what
analysis.replay needs is written to run_dir/replay/<baseline unit>.jsonl, with the decode costs measured here.

Records: "replay_prompt" (the prompt's and the output's tokens, how it ended); "replay", per proposer: under
greedy, whether the draft's proposal matches the output at each position (the draft decoding one token at a
time, as in the loop), under sampling, alpha = sum min(p, q) at each position (from batched passes) and, when
llama.cpp's rule is swept, the same matches ("match_exact") with p of the draft's top token ("alpha_exact");
none for llama.cpp's n-gram types, whose steps analysis.replay recomputes from the tokens; "costs" (the target's
blocks and each draft's decodes, k = 1..gamma_max + 1, or an n-gram type's own longest draft + 1 where longer, at
two contexts: medians and the spread of their repetitions)."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from harness.bench.worker import isolated_unit, record_attempt
from harness.instance import Instance
from harness.plan import Params
from harness.rundir import REPLAY_DIR, cache_dir, load_records, trace_path, unit_id
from harness.specs import DraftSpec

KIND = "replay"
LOOKUP_CALLS = 8  # propose calls timed per text for a stateful model-free proposer


def replay_unit(base: Instance, round_: int, prompts: list, proposers: list[DraftSpec], gamma_max: int, params: Params,
                run_dir: Path) -> dict:
    from harness.bench.partial import UNIT, replay_done, resume
    from harness.calibrate import in_situ, pooled, spanned_contexts
    from harness.engine import Engine
    from harness.promptcache import PromptCache, teacher_forced
    from harness.sampling import process
    from harness.trace import TraceWriter, discard
    from harness.verify import overlap

    t0 = time.perf_counter()
    unit = unit_id(base.id, round_)
    records = load_records(run_dir, {unit})
    gens = {r["prompt_id"]: r for r in records if r.get("type") == "generation" and r.get("repeat", 0) == 0}
    plain_steps = [r for r in records if r.get("type") == "step"]
    # the loop's overhead per verified row (Costs.overhead_ms_per_row): a plain step verifies one
    overhead = sum(r["overhead_ms"] for r in plain_steps) / max(sum(r["proposed"] + 1 for r in plain_steps), 1)
    policy = base.policy
    cfg = base.engine_config(params.n_ctx)
    # the plan lets a replay have one draft offload and cache type, which every draft model gets
    draft_cfg = replace(cfg, n_gpu_layers=params.ngl_draft[0], cache_k=params.cache_type_k_draft[0],
                        cache_v=params.cache_type_v_draft[0])
    from harness.models.catalog import resolve
    models = [p.model for p in proposers if p.model]
    names = [str(p) for p in proposers]  # as the replay's records name them
    out_file = trace_path(run_dir / REPLAY_DIR, unit)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    written = per_prompt(proposers, policy.greedy)
    keep = resume({KIND: out_file}, run_dir / REPLAY_DIR, unit,  # an interrupted unit goes on
                  lambda traces: replay_done(traces[KIND], names, [str(p) for p in written]))
    if not keep:
        discard(out_file)
    tw = TraceWriter(out_file, config=base.id, mode=KIND, policy=policy.label)
    cache = PromptCache(cache_dir(run_dir)) if params.prompt_cache else None
    engines = {}
    try:
        target = engines["target"] = Engine(resolve(base.target).path, cfg)
        for m in models:
            engines[m] = Engine(resolve(m).path, draft_cfg)
        todo = []  # (prompt, its tokens, its plain output, the end-of-generation token or None)
        for pr in prompts:
            g = gens.get(pr.id)
            if g is not None:
                eos = g["stop"] == "eos" and g.get("stop_token") is not None  # older traces lack the token
                todo.append((pr, target.vocab.tokenize(pr.render(target.vocab)), list(g["tokens"]),
                             g["stop_token"] if eos else None))
        texts = [toks for _, toks, _, _ in todo]

        # blocks up to the longest draft: the sweep's gammas, and llama.cpp's n-gram types' own
        k_max = max([gamma_max, *(p.own_gamma or 0 for p in proposers)]) + 1

        def costs() -> dict[str, dict]:
            """Per proposer, its costs over the prompts' own text at a short and a long context."""
            text = [t for x in texts for t in x]
            ctxs = spanned_contexts([len(x) for x in texts], [len(t) + len(o) for _, t, o, _ in todo], k_max)
            starts = [x[:-1] for x in texts]  # as teacher_forced and stepwise_argmax evaluate a prompt
            t = in_situ(target, None, text, k_max, ctxs, cache=cache, prefixes=starts)
            out = {}
            for spec, name in zip(proposers, names):
                if spec.model:
                    d = in_situ(None, engines[name], text, k_max, ctxs, cache=cache, prefixes=starts)
                    d = {k: v for k, v in d.items() if k.startswith("draft_")}
                else:  # a model-free proposer's own time, without a spread
                    d = {"draft_ms_by_context": [[lookup_ms(spec, texts)] * k_max] * len(t["contexts"])}
                out[name] = t | {"proposer": name, "overhead_ms": overhead} | d
            return out
        # measured before the prompts and again after them, minutes apart, and pooled: a machine's drift between
        # the two moments lands in the costs' spreads rather than in one moment's level
        before = costs() if texts and UNIT not in keep else {}
        for pr, toks, out, stop in todo:
            eos = stop is not None
            forced = [*out, stop] if eos else out  # rows predict positions 0..n-1 (and n)
            if (pr.id, 0) in keep:
                continue
            common = {"category": pr.category, "prompt_id": pr.id, "repeat": 0}
            tw.write({"type": "replay_prompt", **common, "prompt_tokens": toks, "tokens": out,
                      "stop_token": stop, "max_tokens": params.max_tokens or pr.max_tokens})
            # the target's own pass, for the proposers that write a record (none: llama.cpp's n-gram types alone)
            p_rows = None if policy.greedy or not written else [process(r, policy)
                                                                for r in teacher_forced(target, toks, forced, cache)]
            for spec, name in zip(proposers, names):
                if spec not in written:
                    continue  # recomputed from the tokens by analysis.replay
                if spec.ngram:
                    from harness.proposers import NgramProposer
                    ng = NgramProposer(spec.ngram)
                    blocks = []  # per step start j: p of each token the lookup proposes there, at its position
                    for j in range(len(p_rows)):
                        x = ng.propose([*toks, *out[:j]], gamma_max).tokens
                        blocks.append([round(p_rows[j + i].prob(t), 6) for i, t in enumerate(x)
                                       if j + i < len(p_rows)])
                    tw.write({"type": KIND, **common, "proposer": name, "alpha_blocks": blocks})
                    continue
                # the draft's top token along the output: greedy's proposals, and llama.cpp's rule's, whose target
                # samples with the plain twin's own random draws, one per token, so that its output is the twin's
                guess = stepwise_argmax(engines[name], toks, forced, cache) \
                    if policy.greedy or "exact" in params.verify else None
                match = None if guess is None else [int(a == t) for a, t in zip(guess, forced)]
                if policy.greedy:
                    tw.write({"type": KIND, **common, "proposer": name, "match": match})
                else:
                    rows = teacher_forced(engines[name], toks, forced, cache)
                    alpha = [round(overlap(p, process(r, policy)), 6) for p, r in zip(p_rows, rows)]
                    rec = {"type": KIND, **common, "proposer": name, "alpha": alpha}
                    if match is not None:
                        rec |= {"match_exact": match,
                                "alpha_exact": [round(p.prob(a), 6) for p, a in zip(p_rows, guess)]}
                    tw.write(rec)
        if before:
            for name, rec in costs().items():
                tw.write(pooled(before[name], rec))
        return {"status": "ok", "prompts": len(texts), "wall_s": time.perf_counter() - t0} | (
            {"prompt_cache": cache.counts()} if cache else {})
    finally:
        tw.close()
        for e in engines.values():
            e.close()


def proposers(instances: list[Instance], params: Params, base: Instance | None = None) -> list[DraftSpec]:
    """What the replay runs a baseline's outputs through: every draft the sweep pairs with that baseline (with
    any baseline when base is None)."""
    return list(dict.fromkeys(i.draft for i in instances if not i.baseline
                              and (base is None or i.plain().id == base.id))) or \
        [d for d in params.draft if not d.plain]


def per_prompt(proposers: list[DraftSpec], greedy: bool) -> list[DraftSpec]:
    """The proposers that write a replay record per prompt: a lookup's steps are recomputed from the tokens under
    greedy, and llama.cpp's n-gram types' under any policy (analysis.replay.llama_ngram_steps)."""
    return [p for p in proposers if p.model or (p.ngram and not greedy)]


def stepwise_argmax(engine, prompt: list[int], forced: list[int], cache=None) -> list[int]:
    """The draft's greedy choice at each position, decoded one token at a time along the forced output as the
    loop's draft decodes (a batched pass rounds differently and can flip a near-tie, which the loop never sees).
    cache: the run's prompt cache, for the prompt but its last token, as the loop's draft evaluates it."""
    from harness.promptcache import evaluate_prompt
    engine.reset()
    evaluate_prompt(engine, prompt[:-1], cache)
    out = [int(engine.decode([t], logits="last")[0].argmax()) for t in [prompt[-1], *forced[:-1]]]
    engine.reset()
    return out


def lookup_ms(spec: DraftSpec, texts: list[list[int]]) -> float:
    """Median ms of a model-free proposer's propose call over the prompts' own texts: the harness's lookup over each
    whole text; one of llama.cpp's n-gram types, fresh and begun on a text's first half, at each of the next
    LOOKUP_CALLS positions, as a generation calls it (its state grows with the cache)."""
    import statistics

    from harness.llamangram import proposer
    from harness.proposers import NgramProposer
    from harness.sampling import Policy
    times = []
    for t in texts:
        if spec.ngram:
            p, n, calls = NgramProposer(spec.ngram), 4, [t]
        else:
            half = len(t) // 2
            p, n = proposer(spec), spec.own_gamma
            p.prefill(t[:half], Policy())
            calls = [t[:j] for j in range(half + 1, min(len(t), half + LOOKUP_CALLS) + 1)]
        for ctx in calls:
            s = time.perf_counter()
            p.propose(ctx, n)
            times.append((time.perf_counter() - s) * 1000)
            p.accepted(ctx, 0)
    return statistics.median(times)


def _child(attempt: str, base_d: dict, round_: int, prompts: list, proposers: list[DraftSpec], gamma_max: int,
           params: Params, run_dir: str) -> None:
    base, rd = Instance.from_dict(base_d), Path(run_dir)
    record_attempt(attempt, base, round_, rd / REPLAY_DIR,
                   lambda: replay_unit(base, round_, prompts, proposers, gamma_max, params, rd),
                   proposers=[str(p) for p in proposers], gamma_max=gamma_max)


def run_replay(base: Instance, round_: int, prompts: list, proposers: list[DraftSpec], gamma_max: int, params: Params,
               run_dir: Path, on_start=None) -> dict:
    """replay_unit in a fresh process, as bench.worker runs a configuration."""
    return isolated_unit(_child, base, round_, run_dir / REPLAY_DIR,
                         (prompts, proposers, gamma_max, params, str(run_dir)), on_start)
