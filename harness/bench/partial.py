"""Resuming a unit where it stopped. A worker writes its traces as it goes, so a unit interrupted before its
result row holds every prompt it finished and, at the end, part of the one in flight. Its worker, started again,
keeps the finished prompts, drops the partial one's records (each prompt's records stay in the trace once) and
runs only the rest. A unit with a result row (an error, a busy run measured again) starts afresh.

A prompt is finished when the last record its unit writes for it is there: for a timed unit, its generation in
every trace (the speculative one and its paired plain twin) and, where a greedy output differs from plain
decoding, the divergence record written after both; for the replay, its replay_prompt record and one record per
proposer. The unit's own records (its decode costs, which belong to no prompt) are kept when complete, under
the key UNIT."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from harness.rundir import finished
from harness.trace import gzipped, read_records

Key = tuple[str | None, int]  # a prompt's id and repeat
UNIT: Key = (None, 0)  # the unit's own records


def key(r: dict) -> Key:
    return r.get("prompt_id"), r.get("repeat", 0)


def timed_done(traces: dict[str, list[dict]], check: bool, plain_ref: dict[Key, list[int]]) -> set[Key]:
    """Finished prompts of a timed unit, from its traces by mode. check: its greedy output is checked against
    plain decoding, its paired twin's or else plain_ref (the baseline configuration's outputs)."""
    gens = {m: {key(r): r["tokens"] for r in recs if r.get("type") == "generation"} for m, recs in traces.items()}
    done = set.intersection(*(set(g) for g in gens.values()))
    if check:
        spec, plain = gens["speculative"], gens.get("baseline", plain_ref)
        diverged = {key(r) for r in traces["speculative"] if r.get("type") == "divergence"}
        done = {k for k in done if plain.get(k) in (None, spec[k]) or k in diverged}
    costs = any(r.get("type") == "costs" for recs in traces.values() for r in recs)
    return done | ({UNIT} if costs else set())


def replay_done(records: list[dict], proposers: list[str], per_prompt: list[str]) -> set[Key]:
    """Finished prompts of a replay unit: each of per_prompt (the proposers that write a record per prompt) wrote
    its record. UNIT once every one of `proposers` has its costs."""
    have = {(key(r), r["proposer"]) for r in records if r.get("type") == "replay"}
    done = {key(r) for r in records if r.get("type") == "replay_prompt"
            if all((key(r), p) in have for p in per_prompt)}
    costs = {r.get("proposer") for r in records if r.get("type") == "costs"}
    return done | ({UNIT} if proposers and costs >= set(proposers) else set())


def resume(files: dict[str, Path], results_dir: Path, unit: str,
           done_of: Callable[[dict[str, list[dict]]], set[Key]]) -> set[Key]:
    """What an interrupted unit keeps: done_of(its records by trace) when it has no result row and every trace
    is there, each trace rewritten with the kept records alone; empty otherwise (the caller starts afresh)."""
    if unit in finished(results_dir):
        return set()
    found = {m: next((f for f in (p, gzipped(p)) if f.exists()), None) for m, p in files.items()}
    if not all(found.values()):
        return set()
    traces = {m: read_records(f) for m, f in found.items()}
    keep = done_of(traces)
    if keep:
        for m, path in files.items():
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in traces[m] if key(r) in keep),
                           encoding="utf-8")
            gzipped(path).unlink(missing_ok=True)
            tmp.replace(path)
    return keep
