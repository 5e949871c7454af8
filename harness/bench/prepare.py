"""Before a sweep runs: refuse what cannot run, gather the calibrations the cost model needs, and record what
the report will say of each model."""
from __future__ import annotations

from pathlib import Path

import click

from harness.errors import HarnessError
from harness.plan import Instance


def preflight(instances: list[Instance], prompts: list, skip_unsupported: bool, max_tokens: int = 0,
              n_ctx: int = 2048) -> dict[str, str]:
    """Refuse what cannot run before anything runs. Returns instance ids to record as skipped, with why."""
    from harness.align import require_aligned
    from harness.bench.memory import check_memory
    from harness.llamacpp import GPU_BUILD_HINT, gpu_offload_supported
    from harness.models.catalog import load_catalog, require_present, resolve
    from harness.pair import parse_ngram
    from harness.proposers import NgramProposer

    cat = load_catalog()
    models = {i.target for i in instances} | {i.draft for i in instances if parse_ngram(i.draft) is None} - {"none"}
    for ref in sorted(models):
        m = resolve(ref, cat)
        require_present(m)
    for i in instances:
        n = parse_ngram(i.draft)
        if n is not None:
            NgramProposer(n)
    skipped = {}
    if not gpu_offload_supported():
        gpu = [i for i in instances if i.ngl > 0 or i.ngl_draft > 0]
        if gpu and not skip_unsupported:
            raise HarnessError(f"--ngl/--ngl-draft above 0 asks for GPU offload, but {GPU_BUILD_HINT} "
                               "(or pass --skip-unsupported to record those configurations as skipped)")
        skipped = {i.id: "GPU offload requested but this build has none" for i in gpu}
    check_memory([i for i in instances if i.id not in skipped], n_ctx)
    checked = set()
    for i in instances:
        if i.baseline or parse_ngram(i.draft) is not None or (i.target, i.draft) in checked:
            continue
        require_aligned(resolve(i.target, cat).path, resolve(i.draft, cat).path, prompts)
        checked.add((i.target, i.draft))
    check_parallel_fits([i for i in instances if i.parallel > 1], prompts, max_tokens, n_ctx)
    return skipped


def check_parallel_fits(instances: list[Instance], prompts: list, max_tokens: int, n_ctx: int) -> None:
    """N sequences share --n-ctx (n_ctx / N positions each): refuse in one line where a prompt would not fit."""
    from harness.llamacpp import Vocab, load_model
    from harness.models.catalog import resolve
    vocabs = {}
    for i in sorted(instances, key=lambda i: (-i.parallel, -i.gamma)):
        if i.target not in vocabs:
            v = Vocab(load_model(resolve(i.target).path, vocab_only=True))
            vocabs[i.target] = [(len(v.tokenize(p.render(v))), max_tokens or p.max_tokens, p) for p in prompts]
        for n_prompt, mt, p in vocabs[i.target]:
            need, n = n_prompt + mt + i.gamma + 1, i.parallel
            if n * need > n_ctx:
                raise HarnessError(
                    f"--parallel {i.parallel}: {n} sequences x (prompt {n_prompt} + max tokens {mt} + gamma {i.gamma} "
                    f"+ 1 = {need} positions, prompt {p.id}) need {n * need} but --n-ctx is {n_ctx}, shared among "
                    f"them: raise --n-ctx to {n * need} or lower --parallel")


def cost_needs(instances: list[Instance]) -> set[tuple[str, int, int]]:
    """(model, threads, ngl) triples whose decode costs the cost model needs."""
    from harness.engine import EngineConfig
    from harness.pair import parse_ngram
    out = set()
    for i in instances:
        if i.baseline:
            continue
        t = EngineConfig(threads=i.threads).resolved_threads()
        out.add((i.target, t, i.ngl))
        if parse_ngram(i.draft) is None:
            out.add((i.draft, t, i.ngl_draft))
    return out


def prepare_calibrations(instances: list[Instance], run_dir: Path, calibrate: bool) -> None:
    """Copy (or, with --calibrate, measure) every needed calibration into the run directory.
    Adaptive gamma cannot run without them. --calibrate saves what it measures in the reports directory the run
    lives in (--out, whose runs/ holds it): OUT/calibration; without it they are looked up there, then in
    reports/calibration, where `harness calibrate` saves them by default."""
    import shutil

    from harness import calibrate as cal
    from harness.models.catalog import resolve
    needs = cost_needs(instances)
    adaptive = any(i.adaptive for i in instances)
    dest = run_dir / "calibration"
    dest.mkdir(exist_ok=True)
    # run_dir is OUT/runs/NAME (a resumed one elsewhere falls back to reports/calibration)
    from harness.rundir import RUNS_DIR
    own = run_dir.parent.parent / "calibration" if run_dir.parent.name == RUNS_DIR else cal.CAL_DIR
    roots = [own] + ([cal.CAL_DIR] if own.resolve() != cal.CAL_DIR.resolve() else [])
    for ref, threads, ngl in sorted(needs):
        name = resolve(ref).name
        if cal.cal_path(name, threads, ngl, dest).exists():
            continue  # a resumed run keeps the costs its finished configurations ran with
        src = next((p for p in (cal.cal_path(name, threads, ngl, r) for r in roots) if p.exists()),
                   cal.cal_path(name, threads, ngl, roots[0]))
        if calibrate:
            click.echo(f"calibrating {name} (threads {threads}, ngl {ngl})", err=True)
            src = cal.save(cal.calibrate(ref, threads, ngl), roots[0])
        if src.exists():
            shutil.copy(src, cal.cal_path(name, threads, ngl, dest))
        elif adaptive:
            raise HarnessError(f"--gamma auto needs the decode costs of {name} (threads {threads}, ngl {ngl}): run "
                               f"`harness calibrate {name} --threads {threads} --ngl {ngl}` or add --calibrate")


def models_info(names: set[str]) -> dict[str, dict]:
    """What the report header says of each model, recorded in plan.json when the run starts, so a report
    never depends on the model files still being there."""
    from harness.models.catalog import resolve
    from harness.models.store import read_sidecar
    from harness.pair import parse_ngram
    out = {}
    for n in sorted(names - {"none"}):
        if parse_ngram(n) is not None:
            out[n] = {"quant": "", "bytes": 0, "sha256": "", "note": "n-gram lookup (no model)"}
            continue
        m = resolve(n)
        side = read_sidecar(m.path)
        note = f"requantized from {side.get('derived_from', m.derive_from)} (never better than its source)" \
            if m.requantized else ""
        out[n] = {"quant": m.quant or side.get("info", {}).get("quant", ""), "bytes": m.path.stat().st_size,
                  "sha256": side.get("sha256") or m.sha256 or "", "note": note}
    return out
