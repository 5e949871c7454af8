"""Before a sweep runs: refuse what cannot run, gather the calibrations the cost model needs, and record what
the report will say of each model."""
from __future__ import annotations

from pathlib import Path

import click

from harness.errors import HarnessError
from harness.instance import Instance


def preflight(instances: list[Instance], prompts: list, skip_unsupported: bool, max_tokens: int = 0,
              n_ctx: int = 2048, engine: str = "harness") -> dict[str, str]:
    """Refuse what cannot run before anything runs. Returns instance ids to record as skipped, with why. With
    --engine server, llama-server's build decides offload (serverunit.server_offload), not this wheel's."""
    from harness.align import require_aligned
    from harness.bench.memory import check_memory
    from harness.llamacpp import GPU_BUILD_HINT, gpu_offload_supported
    from harness.models.catalog import load_catalog, require_present, resolve

    cat = load_catalog()
    models = {i.target for i in instances} | {i.draft.model for i in instances if i.draft.model}
    for ref in sorted(models):
        m = resolve(ref, cat)
        require_present(m)
    from harness.models.arch import require_rollback
    # speculation rolls a rejected draft back, in both models, and the probe does in each: from the headers
    require_rollback({ref: resolve(ref, cat).path for ref in sorted(models)})
    require_heads(instances, cat)
    skipped = {}
    if engine != "server" and not gpu_offload_supported():
        gpu = [i for i in instances if i.ngl > 0 or i.ngl_draft > 0]
        if gpu and not skip_unsupported:
            raise HarnessError(f"--ngl/--ngl-draft above 0 asks for GPU offload, but {GPU_BUILD_HINT} "
                               "(or pass --skip-unsupported to record those configurations as skipped)")
        skipped = {i.id: "GPU offload requested but this build has none" for i in gpu}
    check_memory([i for i in instances if i.id not in skipped], n_ctx)
    checked = set()
    for i in instances:
        if not i.draft.model or (i.target, i.draft.model) in checked:
            continue
        require_aligned(resolve(i.target, cat).path, resolve(i.draft.model, cat).path, prompts)
        checked.add((i.target, i.draft.model))
    check_prompts_fit(instances, prompts, max_tokens, n_ctx)
    return skipped


def require_heads(instances: list[Instance], cat: dict) -> None:
    """llama-server's drafting heads (specs.ServerType) read from their files' headers: one line where a file does
    not carry the head its type needs."""
    from harness.models.arch import require_head
    from harness.models.catalog import resolve
    from harness.specs import HEADS, Combined
    for i in instances:
        for d in i.draft.parts if isinstance(i.draft, Combined) else (i.draft,):
            if d.server_type in HEADS:
                require_head(d.kind, resolve(i.target, cat).path, Path(d.head).expanduser() if d.head else None)


def check_prompts_fit(instances: list[Instance], prompts: list, max_tokens: int, n_ctx: int) -> None:
    """A prompt, its max tokens and a step's gamma + 1 must fit --n-ctx, which N sequences share (n_ctx / N
    positions each): refused in one line before anything runs (a dry run's estimate too), not unit by unit."""
    from harness.llamacpp import Vocab, load_model
    from harness.models.catalog import resolve
    vocabs = {}
    for i in sorted(instances, key=lambda i: (-i.parallel, -i.gamma)):
        if i.target not in vocabs:
            v = Vocab(load_model(resolve(i.target).path, vocab_only=True))
            vocabs[i.target] = [(len(v.tokenize(p.render(v))), max_tokens or p.max_tokens, p) for p in prompts]
        for n_prompt, mt, p in vocabs[i.target]:
            need, n = n_prompt + mt + i.gamma + 1, i.parallel
            if n * need <= n_ctx:
                continue
            if n == 1:
                what = f"--max-tokens {mt}" if max_tokens else f"its own max_tokens {mt}"
                raise HarnessError(f"prompt {p.id} ({n_prompt} tokens) + {what} + gamma {i.gamma} + 1 = {need} "
                                   f"positions exceed --n-ctx {n_ctx}: raise --n-ctx to {need}, lower the max "
                                   "tokens, or leave that prompt out")
            raise HarnessError(
                f"--parallel {i.parallel}: {n} sequences x (prompt {n_prompt} + max tokens {mt} + gamma {i.gamma} "
                f"+ 1 = {need} positions, prompt {p.id}) need {n * need} but --n-ctx is {n_ctx}, shared among "
                f"them: raise --n-ctx to {n * need} or lower --parallel")


def cost_needs(instances: list[Instance]) -> set[tuple[str, int, int]]:
    """(model, threads, ngl) triples whose decode costs the cost model needs."""
    from harness.engine import EngineConfig
    out = set()
    for i in instances:
        if i.baseline:
            continue
        t = EngineConfig(threads=i.threads).resolved_threads()
        out.add((i.target, t, i.ngl))
        if i.draft.model:
            out.add((i.draft.model, t, i.ngl_draft))
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


def models_info(names: set[str], targets: set[str] = frozenset()) -> dict[str, dict]:
    """What the report header says of each model (drafts as specs, `targets` as models: a target is never read
    as a draft, so a '+' in its path is its name's), recorded in plan.json when the run starts, so a report
    never depends on the model files still being there."""
    from harness.models import arch
    from harness.models.catalog import resolve
    from harness.models.store import current_sha, read_sidecar
    out = {}
    from harness.specs import DraftModel, parse_draft
    for n in sorted(set(names) | set(targets)):
        spec = DraftModel(n) if n in targets else parse_draft(n)
        ref = spec.model or spec.head  # a combination's draft model, a drafting head's file
        if ref is None:
            note = "n-gram lookup (no model)" if spec.model_free else "the target's own MTP layers"
            out[n] = {"quant": "", "bytes": 0, "sha256": "", "note": note}
            continue
        m = resolve(ref)
        side = read_sidecar(m.path)
        source = side.get("derived_from", m.derive_from) if m.requantized else None
        note = f"requantized from {source} (never better than its source)" if source else ""
        out[n] = {"quant": m.quant or side.get("info", {}).get("quant", ""), "bytes": m.path.stat().st_size,
                  "sha256": side.get("sha256") or m.sha256 or current_sha(m.path), "note": note,
                  "arch": arch.read(m.path)} | ({"derived_from": source} if source else {})
    return out


def same_models(plan: dict) -> None:
    """Refuse to resume a run on model files other than those it started with (plan.json's sha256 of each; a
    plan from before path models had one, their size): one run would mix two files under one name."""
    from harness.models.catalog import resolve
    from harness.models.store import current_sha
    for name, info in sorted((plan.get("models") or {}).items()):
        if not info.get("sha256") and not info.get("bytes"):
            continue  # an n-gram lookup
        try:
            path = resolve(name).path
        except HarnessError:
            continue  # no longer in the catalog: preflight says so
        if not path.is_file():
            continue  # preflight says so
        if info.get("sha256"):
            was, now = info["sha256"], current_sha(path)
            what = f"sha256 {was[:12]}..., now {now[:12]}..."
        else:
            was, now = info["bytes"], path.stat().st_size
            what = f"{was} bytes, now {now}"
        if now != was:
            raise HarnessError(f"model '{name}' at {path} is not the file this run started with ({what}): restore "
                               "that file to resume the run, or start a new run")


def same_sizes(plan: dict, run_dir: Path) -> None:
    """Before each unit: a model file whose size moved since the run started was replaced mid-run (another quant,
    another tokenizer), and the unit would measure it under the old name. Sizes only: hashing per unit costs
    seconds; a resume compares the sha256 (same_models)."""
    from harness.models.catalog import resolve
    from harness.specs import DraftModel, parse_draft
    targets = {i.get("target") for i in plan.get("instances", [])}
    for name, info in sorted((plan.get("models") or {}).items()):
        spec = DraftModel(name) if name in targets else parse_draft(name)
        ref = spec.model or spec.head
        try:
            path = resolve(ref).path if ref and info.get("bytes") else None
            now = path.stat().st_size if path else None
        except (HarnessError, OSError):
            continue  # gone: the unit's own load says so
        if now is not None and now != info["bytes"]:
            raise HarnessError(f"model '{name}' at {path} was replaced while the run ran ({info['bytes']} bytes when "
                               f"it started, {now} now): the units finished so far are kept; restore that file and "
                               f"`harness bench --resume {run_dir}`, or start a new run")


def same_prompts(plan: dict, pool: list) -> None:
    """Refuse to resume a run whose prompts changed under their ids (plan.json's digest of each, from schema 2):
    its units would measure two prompts under one name."""
    was = plan.get("prompt_digests") or {}
    for p in pool:
        if p.id in was and p.digest != was[p.id]:
            raise HarnessError(f"prompt '{p.id}' ({p.category}) changed in the prompt files since this run started: "
                               "restore its text to resume the run, or start a new run")


def out_dir(out: str) -> Path:
    """--out as given, refused when empty (it would be the current directory)."""
    if not out.strip():
        raise HarnessError("--out is empty: give the reports directory (default reports)")
    return Path(out)


# report.render's first line (and the one it wrote before 2026-12-01): how a latest.md the harness wrote is told
# from the user's own
REPORT_HEADINGS = (b"# Should I use speculative decoding here?", b"# Speculative decoding benchmark")


def check_out(out_root: Path, resume: Path | None) -> None:
    """Before anything is made: a --out inside a run directory would nest a run in it, and a latest.md there that
    the harness did not write would be overwritten by the report."""
    from harness.report import reports_root
    from harness.rundir import read_plan
    if resume:
        read_plan(resume)  # a directory that is not a run says so first
    o = out_root.resolve()
    run = None if resume else next((d for d in (o, *o.parents) if (d / "plan.json").is_file()), None)
    if run is not None:
        raise HarnessError(f"--out {out_root} is inside the run directory {run}: give a reports directory (runs land "
                           f"in its runs/), or continue that run with --resume {run}")
    latest = (reports_root(resume) if resume else out_root) / "latest.md"
    if latest.exists() and not (latest.is_file() and latest.read_bytes().startswith(REPORT_HEADINGS)):
        raise HarnessError(f"{latest} was not written by the harness, and the report would replace it: move it "
                           "away, or give another --out")
