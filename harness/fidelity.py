"""Quantization fidelity: how far a lower-precision GGUF of a model drifts from a reference quant.

The reference (the higher-precision file) generates greedily for each prompt; that output is the
teacher-forced sequence. Every model, the reference included, then evaluates the same prompt + output
tokens the same way (one batched pass, in chunks of n_batch) with logits on the output positions. Per
position p = softmax(reference logits), q = softmax(other logits) at temperature 1 over the full vocabulary;
alpha = sum_x min(p(x), q(x)) (the acceptance rate a speculative decoder would see with the other model as a
draft at T=1) and top-1 agreement = argmax equal. Both are averaged over every position of every prompt.

Each model runs in its own spawned process (clean peak RSS; a crash in llama.cpp becomes an error row).
Children write their logits to a temporary directory; the parent compares them one prompt at a time.
"""
from __future__ import annotations

import json

import shutil
import tempfile
import traceback
from pathlib import Path

import numpy as np

from harness.errors import HarnessError
from harness.models.catalog import Model
from harness.models.store import read_sidecar
from harness.procs import death, peak_rss_bytes, run_isolated
from harness.promptcache import teacher_forced
from harness.prompts import Prompt

CAPTION = ("alpha = sum min(p, q) and top-1 agreement vs the reference, teacher-forced on the reference's greedy "
           "output (T=1, full vocabulary); a requantized file can never be better than its source.")
_ROW_CHUNK = 16  # rows per softmax block in the comparison (bounded memory for 150k-token vocabularies)


# -- model facts --------------------------------------------------------------------------------------------
def _resolve(ref: str) -> Model:
    """A catalog name or a .gguf path; a path is enough when there is no catalog here."""
    from harness.models import catalog
    m = catalog.resolve(ref)
    if m.kind == "file":
        try:
            cat = catalog.load_catalog()
        except HarnessError:
            cat = {}  # no catalog here: the path is enough
        if m.name in cat and cat[m.name].path.resolve() == m.path.resolve():
            m = cat[m.name]  # a path to a catalog file: keep its quant and derivation
    catalog.require_present(m)
    return m


def _quant(m: Model, side: dict) -> str:
    """From the catalog or the sidecar; "" when neither says (the worker then reads general.file_type)."""
    if m.quant:
        return m.quant
    return side["ftype"] if isinstance(side.get("ftype"), str) else ""


def _file_type_name(ftype) -> str:
    try:
        import gguf
        return gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError, TypeError):
        return str(ftype) if ftype is not None else ""


def _describe(m: Model) -> dict:
    side = read_sidecar(m.path)
    requant = m.kind == "derived" or side.get("requantized") is True
    note = ""
    if requant:
        src = m.derive_from or side.get("derived_from") or "its source"
        src_q = side.get("derived_from_quant")
        note = f"requantized from {src}" + (f" ({src_q})" if src_q else "")
    return {"model": m.name, "quant": _quant(m, side), "bytes": m.path.stat().st_size,
            "requantized": bool(requant), "note": note}


# -- child processes ----------------------------------------------------------------------------------------
def _timed_generation(engine, tokens: list[int], max_tokens: int) -> dict:
    from harness.loop import Request, generate
    from harness.sampling import Policy
    g = generate(engine, Request("timing", tokens, max_tokens), Policy())
    return {"tokens_per_s": g["tokens_per_s"], "timed_tokens": g["n_tokens"], "tokens": g["tokens"]}


def _reference_job(job: dict, work: Path) -> dict:
    """Greedy generation per prompt (the teacher sequences), then the teacher-forced pass."""
    from harness.engine import Engine, EngineConfig
    from harness.loop import Request, check_fits, generate
    from harness.sampling import Policy
    cfg = EngineConfig(n_ctx=job["n_ctx"], threads=job["threads"])
    with Engine(Path(job["path"]), cfg) as eng:
        seqs = []
        for pr in job["prompts"]:
            toks = eng.vocab.tokenize(pr.render(eng.vocab))
            check_fits(len(toks), job["max_tokens"], 0, eng.n_ctx)
            g = generate(eng, Request(pr.id, toks, job["max_tokens"], pr.category), Policy())
            seqs.append({"id": pr.id, "prompt": toks, "output": g["tokens"]})
        (work / "sequences.json").write_text(json.dumps(seqs))
        agree = positions = 0
        for i, s in enumerate(seqs):
            logits = teacher_forced(eng, s["prompt"], s["output"])
            np.save(work / f"{job['tag']}-{i}.npy", logits)
            agree += int((logits.argmax(axis=1) == np.asarray(s["output"], dtype=np.int64)).sum())
            positions += len(s["output"])
        timed = _timed_generation(eng, seqs[0]["prompt"], job["max_tokens"])
        return {"status": "ok", "n_vocab": eng.n_vocab, "file_type": eng.vocab.meta("general.file_type"),
                "positions": positions, "greedy_consistent": agree,
                "tokens_per_s": timed["tokens_per_s"], "timed_tokens": timed["timed_tokens"]}


def _other_job(job: dict, work: Path) -> dict:
    """The teacher-forced pass over the reference's sequences, then a timed greedy generation."""
    from harness.engine import Engine, EngineConfig
    seqs = json.loads((work / "sequences.json").read_text())
    cfg = EngineConfig(n_ctx=job["n_ctx"], threads=job["threads"])
    with Engine(Path(job["path"]), cfg) as eng:
        for i, s in enumerate(seqs):
            np.save(work / f"{job['tag']}-{i}.npy", teacher_forced(eng, s["prompt"], s["output"]))
        timed = _timed_generation(eng, seqs[0]["prompt"], job["max_tokens"])
        return {"status": "ok", "n_vocab": eng.n_vocab, "file_type": eng.vocab.meta("general.file_type"),
                "tokens_per_s": timed["tokens_per_s"],
                "timed_tokens": timed["timed_tokens"]}


def _child(job: dict, result_path: str) -> None:
    work = Path(job["work"])
    try:
        res = (_reference_job if job["role"] == "reference" else _other_job)(job, work)
    except HarnessError as e:
        res = {"status": "error", "error": str(e), "exit_code": e.exit_code}
    except Exception as e:  # noqa: BLE001 - any failure becomes a row
        res = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    res["peak_rss_bytes"] = peak_rss_bytes()
    Path(result_path).write_text(json.dumps(res))


def _spawn(target, job: dict, result_path: Path) -> dict:
    """Run target(job, result_path) in a fresh spawned process; a process that dies still gives a result."""
    result_path.unlink(missing_ok=True)
    code = run_isolated(target, job, str(result_path))
    res = None
    if result_path.exists():
        try:
            res = json.loads(result_path.read_text())
        except ValueError:
            res = None
    if not isinstance(res, dict):  # a result written before a crash at exit still counts
        res = {"status": "error", "error": death(code) + " without a result"}
    return res


# -- comparison ---------------------------------------------------------------------------------------------
def _softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def compare_logits(ref: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: alpha = sum min(p, q) with p, q the T=1 softmax of each side over its own full vocabulary
    (ids only one side has, padding, count as 0 in the min), and whether the argmaxes agree."""
    if ref.shape[0] != other.shape[0]:
        raise HarnessError(f"teacher-forced row counts differ: {ref.shape[0]} vs {other.shape[0]}")
    k = min(ref.shape[1], other.shape[1])
    alpha = np.empty(ref.shape[0])
    top1 = np.empty(ref.shape[0], dtype=bool)
    for s in range(0, ref.shape[0], _ROW_CHUNK):
        a, b = np.asarray(ref[s:s + _ROW_CHUNK]), np.asarray(other[s:s + _ROW_CHUNK])
        p, q = _softmax(a), _softmax(b)
        alpha[s:s + len(a)] = np.minimum(p[:, :k], q[:, :k]).sum(axis=1)
        top1[s:s + len(a)] = a.argmax(axis=1) == b.argmax(axis=1)
    return alpha, top1


def _compare_files(work: Path, ref_tag: str, tag: str, n_prompts: int) -> tuple[float | None, float | None, int]:
    alpha_sum = top1_sum = 0.0
    n = 0
    for i in range(n_prompts):
        ref = np.load(work / f"{ref_tag}-{i}.npy", mmap_mode="r")
        oth = np.load(work / f"{tag}-{i}.npy", mmap_mode="r")
        a, t = compare_logits(ref, oth)
        alpha_sum += float(a.sum())
        top1_sum += float(t.sum())
        n += len(a)
        del ref, oth
    return (alpha_sum / n if n else None), (top1_sum / n if n else None), n


# -- entry points -------------------------------------------------------------------------------------------
def _row(desc: dict, res: dict) -> dict:
    if not desc["quant"] and res.get("file_type") is not None:
        desc = {**desc, "quant": _file_type_name(res["file_type"])}
    return {**desc, "tokens_per_s": res.get("tokens_per_s"), "peak_rss_bytes": res.get("peak_rss_bytes"),
            "alpha_vs_reference": None, "top1_agreement": None, "positions": 0, "error": res.get("error")}


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def fidelity(reference_ref: str, others: list[str], prompts: list[Prompt], max_tokens: int = 64,
             threads: int = 0, n_ctx: int = 2048) -> list[dict]:
    """Rows {model, quant, bytes, tokens_per_s, peak_rss_bytes, alpha_vs_reference, top1_agreement, positions,
    requantized, note, error}, the reference first (alpha and agreement 1.0 by definition). A model whose
    tokenizer differs from the reference's is refused (HarnessError, exit code 2) before any weights load.
    A model whose worker fails becomes a row with 'error' set; a failing reference raises HarnessError."""
    from harness.align import require_aligned
    if not prompts:
        raise HarnessError("no prompts to evaluate")
    if max_tokens < 1:
        raise HarnessError("max tokens must be >= 1")
    ref_m = _resolve(reference_ref)
    other_ms = [_resolve(r) for r in others]
    for om in other_ms:
        require_aligned(ref_m.path, om.path, prompts)
    descs = [_describe(m) for m in [ref_m, *other_ms]]

    work = Path(tempfile.mkdtemp(prefix="harness-fidelity-"))
    try:
        base = {"prompts": list(prompts), "max_tokens": max_tokens, "threads": threads, "n_ctx": n_ctx,
                "work": str(work)}
        res = _spawn(_child, {**base, "role": "reference", "tag": "m0", "path": str(ref_m.path)},
                     work / "m0.json")
        if res.get("status") != "ok":
            raise HarnessError(f"reference {ref_m.name} failed: {res.get('error')}", res.get("exit_code", 1))
        positions = res["positions"]
        ref_row = _row(descs[0], res)
        consistent = (f"teacher-forced argmax = greedy output at {res['greedy_consistent']}/{positions} positions"
                      if positions else "the reference generated no tokens")
        ref_row.update(alpha_vs_reference=1.0, top1_agreement=1.0, positions=positions,
                       note=_join("reference", descs[0]["note"], consistent))
        rows = [ref_row]
        for j, (om, desc) in enumerate(zip(other_ms, descs[1:]), 1):
            tag = f"m{j}"
            r = _spawn(_child, {**base, "role": "other", "tag": tag, "path": str(om.path)}, work / f"{tag}.json")
            row = _row(desc, r)
            if r.get("status") == "ok":
                alpha, top1, n = _compare_files(work, "m0", tag, len(prompts))
                row.update(alpha_vs_reference=alpha, top1_agreement=top1, positions=n)
                if r["n_vocab"] != res["n_vocab"]:
                    row["note"] = _join(row["note"], f"vocab {r['n_vocab']} vs reference {res['n_vocab']}: "
                                                     "compared over the shared ids")
            else:
                row["note"] = _join(row["note"], f"error: {r.get('error')}")
            for f in work.glob(f"{tag}-*.npy"):
                f.unlink()
            rows.append(row)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fmt(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


def format_table(rows: list[dict]) -> str:
    from tabulate import tabulate
    table = [{
        "model": r["model"],
        "quant": (r.get("quant") or "?") + (" (requantized)" if r.get("requantized") else ""),
        "MiB": _fmt(r["bytes"] / 2**20 if r.get("bytes") else None, ".1f"),
        "tok/s": _fmt(r.get("tokens_per_s"), ".1f"),
        "peak RSS MiB": _fmt(r["peak_rss_bytes"] / 2**20 if r.get("peak_rss_bytes") else None, ".0f"),
        "alpha": _fmt(r.get("alpha_vs_reference"), ".4f"),
        "top-1": _fmt(r.get("top1_agreement"), ".4f"),
        "positions": r.get("positions", 0),
        "note": r.get("note", ""),
    } for r in rows]
    return CAPTION + "\n\n" + tabulate(table, headers="keys", tablefmt="github")


def _as_list(x) -> list[str]:
    if x is None:
        return []
    if isinstance(x, str):
        x = x.split(",")
    return [s.strip() for s in x if s and s.strip()]


def fidelity_command(reference: str, others, categories, per_category: int = 0, max_tokens: int = 64,
                     threads: int = 0) -> str:
    """`harness fidelity REFERENCE OTHER...`: the Markdown table. others and categories: lists or comma
    strings; categories empty = every category; per_category 0 = all prompts of each."""
    from harness import prompts as prompts_mod
    other_refs = _as_list(others)
    if not other_refs:
        raise HarnessError("name at least one model to compare with the reference")
    if per_category < 0:
        raise HarnessError(f"--per-category must be >= 0 (0 = every prompt of each category), got {per_category}")
    prompts = prompts_mod.load(_as_list(categories) or None, None, per_category)
    return format_table(fidelity(reference, other_refs, prompts, max_tokens=max_tokens, threads=threads))
