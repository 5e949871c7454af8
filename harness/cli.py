"""Command line: parses options and delegates. Errors the user can fix become one line on stderr."""
from __future__ import annotations

import sys

import click
from tabulate import tabulate

from harness.engine import CACHE_TYPES
from harness.console import Grouped, Sectioned, home, run_cli, say
from harness.errors import HarnessError


@click.group(cls=Grouped, maintenance=("archive", "crosscheck"))
@click.version_option(package_name="harness")
def cli():
    """Speculative-decoding benchmark harness for GGUF models."""


@cli.group()
def models():
    """The model catalog (models.toml)."""


@models.command("list")
def models_list():
    """Name, family, arch, quant, bytes, present, verified."""
    from harness.models.catalog import load_catalog
    from harness.models.manage import list_rows
    say(tabulate(list_rows(load_catalog()), headers="keys", tablefmt="github"))


@models.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every model in the catalog, derived ones included.")
def models_fetch(names, all_):
    """Download (or build) models, verify sha256, rename into the models directory."""
    from harness.models.manage import fetch_models
    for line in fetch_models(list(names), all_):
        say(line)


@models.command("verify")
@click.argument("names", nargs=-1)
def models_verify(names):
    """Recompute sha256 of present models (or the named ones) against the catalog."""
    from harness.models.manage import verify_models
    rows, ok = verify_models(list(names))
    say(tabulate(rows, headers="keys", tablefmt="github"))
    if not ok:
        raise HarnessError("verification failed for at least one model (see the table)")


@models.command("info")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
def models_info(ref, as_json):
    """Arch, layers, vocab, tokenizer, quant and context length of NAME or PATH."""
    from harness.models.manage import info_text
    say(info_text(ref, as_json))


CACHE_HELP = ", ".join(CACHE_TYPES)
# the options run and bench share, declared once: (name, run's type, what it sets); bench sweeps a comma list of
# each (seed and n_ctx aside), run takes one value, and either shows Params' default
SHARED = (
    ("gamma", int, "draft length per step (bench also takes auto or auto:N: gamma chosen per step)"),
    ("temp", float, "temperature (0 = greedy)"), ("top_p", float, "top-p"), ("top_k", int, "top-k (0 disables)"),
    ("min_p", float, "min-p"), ("ngl", int, "target layers offloaded to the GPU"),
    ("ngl_draft", int, "draft layers offloaded to the GPU"), ("threads", int, "threads (0 = physical cores)"),
    ("verify", str, "verification rule: leviathan (rejection sampling against the draft's q) or exact (llama.cpp's: "
                    "the draft's top token, kept while the target samples it)"),
    ("draft_p_min", float, "stop drafting once the draft's top probability falls below this (llama.cpp's "
                           "--spec-draft-p-min; 0 = never)"),
    ("draft_n_min", int, "drop a draft shorter than this; that step decodes plainly"),
    ("cache_type_k", str, f"target K cache type: {CACHE_HELP}"),
    ("cache_type_v", str, "target V cache type (a quantized one needs flash attention)"),
    ("cache_type_k_draft", str, "draft K cache type"), ("cache_type_v_draft", str, "draft V cache type"),
    ("flash_attn", str, "flash attention, both models: on, off or auto"),
    ("ubatch", int, "physical batch size, both models (smaller shrinks the compute buffer)"),
    ("seed", int, "seeds every sampled generation"),
    ("n_ctx", int, "context size in tokens (bench's --parallel sequences share it)"),
)


def shared_options(many: bool):
    """SHARED's options, for bench (many: comma lists) or run (one value each)."""
    from harness.plan import Params
    defaults = Params().to_dict()

    def add(f):
        for name, kind, what in reversed(SHARED):
            d = defaults[name]
            listed = isinstance(d, list)
            shown = ",".join(map(str, d)) if listed else d
            said = f"Comma list: {what}" if many and listed else what[0].upper() + what[1:]
            text = f"{said}; default {shown}."
            f = click.option(f"--{name.replace('_', '-')}", type=None if many and listed else kind, help=text)(f)
        return f
    return add


@cli.command()
@click.argument("target")
@click.option("--draft", help="Draft model name or path, or ngram:N for prompt lookup.")
@click.option("--prompt", "prompt_text", help="Raw prompt text (the chat template is applied unless --raw).")
@click.option("--prompt-file", type=click.Path(dir_okay=False), help="A file holding the prompt text.")
@click.option("--raw", is_flag=True, help="Do not apply the model's chat template.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="The prompt's own max tokens.")
@click.option("--baseline", is_flag=True, help="Also run plain decoding and compare.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), help="Append per-step JSONL records here.")
@shared_options(many=False)
def run(target, prompt_text, prompt_file, raw, max_tokens, baseline, trace_path, **opts):
    """One generation with TARGET (and a draft): text with accepted draft tokens marked, then a summary.
    Its options are bench's, checked by bench's code, with bench's defaults; each takes one value."""
    from pathlib import Path

    from harness.runner import given_prompt, plan_one, run_one
    inst, params = plan_one(target=target, max_tokens=max_tokens, **opts)
    prompt = given_prompt(prompt_text, prompt_file, raw, max_tokens)
    from harness.errors import naming
    with naming(trace_path, "--trace"):  # the only file `run` writes: a full disk names it and the option
        run_one(inst, params.n_ctx, prompt, max_tokens, baseline, Path(trace_path) if trace_path else None)


@cli.command()
@click.argument("target")
@click.argument("draft")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False), callback=home,
              help="A prompt JSONL file for the round trip.")
@click.option("--json", "as_json", is_flag=True)
def check(target, draft, prompts_path, as_json):
    """Tokenizer alignment of TARGET and DRAFT: exit 0 aligned, 2 misaligned."""
    from harness.align import check_command
    text, code = check_command(target, draft, prompts_path, as_json)
    say(text)
    sys.exit(code)


@cli.command()
@click.argument("target")
@click.argument("paths", nargs=-1, callback=home)
@click.option("--json", "as_json", is_flag=True)
def drafts(target, paths, as_json):
    """Which GGUFs in PATHs (default: models/ and llama.cpp's, LM Studio's, Ollama's folders) can draft for TARGET:
    llama-server's rule, the harness's check, size, rank."""
    from harness.align import check_pair
    from harness.models.draftstable import drafts_command
    say(drafts_command(target, list(paths), as_json, check_pair))


def server_timeouts(f, default: bool = True):  # crosscheck's, server-check's and bench's (None: the plan's)
    for name, s, what in (("--request-timeout", 600.0, "per request"), ("--start-timeout", 300.0, "to load its models "
                          "and answer /health")):
        f = click.option(name, type=float, default=s if default else None, show_default=default,
                         help=f"Seconds llama-server may take {what}" + ("." if default else f" (default {s:g})."))(f)
    return f


@cli.command(cls=Sectioned, rest="Advanced options (docs/usage.md)", first=(  # --help's first screen
    "profile", "target", "draft", "gamma", "temp", "ngl", "ngl_draft", "threads", "categories", "per_category",
    "max_tokens", "budget_min", "out", "resume", "dry_run"))
@click.option("--profile", multiple=True, help="A named profile from profiles.toml (make bench uses 'default').")
@click.option("--target", help="Comma list of target names or paths.")
@click.option("--draft", help="Comma list: names, paths, ngram:N, ngram-simple/-map-k/-map-k4v/-mod/-cache; --engine "
              "server also draft-mtp[:HEAD], draft-eagle3:HEAD, draft-dflash:HEAD, A+B (a --spec-type list); "
              "none = baseline only; not given: picked for the target.")
@shared_options(many=True)
@click.option("--parallel", help="Comma list of how many requests decode together, each its own sequence in one "
                                 "context (llama-server's -np); --n-ctx is shared among them (default 1).")
@click.option("--kv-unified", help="Comma list of off, on: the sequences' KV in one buffer (llama-server's -kvu).")
@click.option("--categories", help="Comma list of prompt categories.")
@click.option("--prompts", help="Comma list of prompt files: the harness's JSONL, chat JSONL ({\"messages\": ...}) or "
              "ShareGPT JSON (instead of prompts/<category>.jsonl).")
@click.option("--per-category", type=int, help="Prompts per category (0 = all).")
@click.option("--max-tokens", type=int, help="Tokens per generation (default: each prompt's own).")
@click.option("--prompt-chars", type=int, help="Each prompt in at most N characters, cut in its middle (0 = whole).")
@click.option("--repeat", type=int, help="Times every prompt runs (default 1); sampled repeats draw afresh.")
@click.option("--out", default="reports", show_default=True,
              help="The reports directory: Markdown reports land here, run directories in its runs/.")
@click.option("--resume", "resume", type=click.Path(file_okay=False), help="Run only what RUN_DIR is missing.")
@click.option("--skip-unsupported", is_flag=True, help="Record GPU configurations as skipped on a CPU-only build.")
@click.option("--calibrate", is_flag=True, default=None,
              help="Measure decode costs first (for --gamma auto and the cost-model table).")
@click.option("--paired/--no-paired", default=None,
              help="Run plain decoding beside every speculative generation, in the same worker, and take "
                   "speedups against it: drift-robust, about 1.3x the time.")
@click.option("--replay/--no-replay", default=None,
              help="Teacher-force every draft along the plain baselines' outputs: acceptance and predicted speedup "
                   "at every gamma up to --replay-gamma, from every prompt.")
@click.option("--replay-gamma", type=int, help="Replay gamma 1..N (default 8).")
@click.option("--prompt-cache/--no-prompt-cache", default=None,
              help="Evaluate each prompt once per model and run, later uses restoring its KV state (saves the "
                   "prompt evaluation that dominates a long prompt's run; latency is then not measured).")
@click.option("--timed-subset", type=int, help="With --replay: time only each proposer's predicted best gamma and "
                                              "gamma 1 per category, on its first N prompts.")
@click.option("--timed-scope", help="--timed-subset times proposers (default) or answers (each one's configuration).")
@click.option("--until-confident", is_flag=True, default=None,
              help="Add prompts to categories whose verdict is inconclusive, one per round, until all settle.")
@click.option("--budget-min", type=float, help="The whole run's time budget in minutes: a run estimated over it is "
                                               "cut to fit first (fewer tokens, gammas, timed prompts); "
                                               "--until-confident adds no round beyond it.")
@click.option("--min-gain", type=float, help="The least gain worth having, as a fraction (default 0.05): below it "
                                              "the answer is 'no gain worth having'; 'speculate' needs more.")
@click.option("--busy-threshold", type=float,
              help="Share of all cores other processes may use before the machine counts as busy (default 0.05).")
@click.option("--allow-busy", is_flag=True, help="Run on a busy machine anyway; its configurations marked unreliable.")
@click.option("--rerun-busy", is_flag=True, help="With --resume: measure again what ran on a busy machine.")
@click.option("--engine", help="Who generates: harness (its own loop, the default) or server (llama-server).")
@click.option("--llama-server", help="What --engine server and --server-check run (default: make native's).")
@click.option("--server-check", type=int, help="Run each answer's configuration in llama-server too (its own type and "
              "flags, speculative and plain), on the category's first N prompts.")
@lambda f: server_timeouts(f, default=False)
@click.option("--dry-run", is_flag=True, help="Print the plan, the time estimate and what the budget cut, then stop "
                                              "(probes each model's prompt and decode costs; runs nothing else).")
def bench(profile, out, resume, skip_unsupported, allow_busy, rerun_busy, dry_run, **opts):
    """Sweep drafts, gamma, sampling and offload per prompt category; write traces and a report."""
    from pathlib import Path

    from harness.bench.autodraft import owning_picks, with_drafts
    from harness.bench.prepare import out_dir
    from harness.bench.run import command_line, run_bench
    from harness.plan import Params, first_round, load_profile, make_params
    command = command_line(click.get_current_context().obj["argv"])
    if len(profile) > 1:
        raise HarnessError(f"--profile given {len(profile)} times ({', '.join(profile)}): give one, and options "
                           "beside it to change what it sets")
    profile = profile[0] if profile else None
    if resume and dry_run:
        raise HarnessError("--dry-run plans a new run from its options; --resume continues a run as planned")
    if resume:
        # --out is let through: a resumed run's report goes beside its directory, as the first one did
        given = [k for k, v in {"profile": profile, **opts}.items() if v is not None]
        if given:
            names = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise HarnessError(f"--resume takes the run's own options from its plan.json, so {names} would be "
                               "ignored: give --resume RUN_DIR with only --allow-busy, --rerun-busy or "
                               "--skip-unsupported (start a new run for other options)")
        if not Path(resume).is_dir():
            raise HarnessError(f"--resume {resume}: no such run directory")
        run_bench(Params(target=["-"]), [], out_dir(out), Path(resume), skip_unsupported, command, allow_busy,
                  rerun_busy)
        return
    if rerun_busy:
        raise HarnessError("--rerun-busy measures again what a run measured on a busy machine: give --resume RUN_DIR")
    with owning_picks(opts, picked := with_drafts(profile, opts)):  # a refusal over a picked draft says so
        params = make_params(load_profile(profile) if profile else {}, picked)
        run_bench(params, first_round(params), out_dir(out), None, skip_unsupported, command, allow_busy,
                  dry_run=dry_run)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--format", "formats", default="md", show_default=True, help="Comma list: md, csv, json, parquet.")
@click.option("--check", "check_only", is_flag=True,
              help="Recompute every figure from the traces; fail on any difference.")
def report(run_dir, formats, check_only):
    """Regenerate the report of RUN_DIR from its traces (or check it)."""
    from pathlib import Path

    from harness import report as report_mod
    rd = Path(run_dir)
    if not rd.is_dir():
        raise HarnessError(f"{run_dir}: no such run directory")
    if check_only:
        causes, diffs = report_mod.differences(rd)
        if causes or diffs:
            click.echo("\n".join((causes + diffs)[:20]))
            raise HarnessError(report_mod.disagreement(causes, diffs))
        say("report matches the traces")
        return
    fmts = report_mod.parse_formats(formats)
    with report_mod.writable(rd, "report"):
        md = report_mod.write_reports(rd, fmts)
    say(str(md) if "md" in fmts else str(rd))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
def archive(run_dir):
    """Make a finished RUN_DIR small enough to commit: gzip its traces, drop what `harness report` makes again
    (the exports, every plot but the first screen's), then check the report against the traces."""
    from pathlib import Path

    from harness.report.archive import archive_command
    if not Path(run_dir).is_dir():
        raise HarnessError(f"{run_dir}: no such run directory")
    say(archive_command(Path(run_dir)))


@cli.command()
@click.argument("model")
@click.option("--threads", type=int, default=0, help="Default: physical cores.")
@click.option("--ngl", type=int, default=0)
@click.option("--k-max", type=int, default=16, show_default=True)
@click.option("--reps", type=int, default=5, show_default=True)
@click.option("--out", callback=home, help="Directory to write the calibration to (default reports/calibration); "
                                            "the file names its machine, so it can travel to `harness predict` "
                                            "elsewhere.")
def calibrate(model, threads, ngl, k_max, reps, out):
    """The llama_decode cost of k = 1..k-max tokens with all logits; stored for the cost model."""
    from pathlib import Path

    from harness import calibrate as cal
    root = Path(out) if out else cal.CAL_DIR
    cal.check_args(k_max, reps)
    root.mkdir(parents=True, exist_ok=True)  # a --out that cannot be written fails now, not after the measuring
    from harness.analysis.noise import unit_summary
    from harness.bench import noise
    from harness.plan import Params
    with noise.Sampler(Params.busy_threshold) as sampler:  # a calibration taken busy gives predict no verdict
        c = cal.calibrate(model, threads, ngl, k_max, reps)
    c["noise"] = sampler.summary()
    path = cal.save(c, root)
    say(tabulate(cal.table_rows(c), headers=cal.table_headers(c), tablefmt="github"))
    say(f"{c['model']}, {c['threads']} threads, ngl {c['ngl']}: saved to {path}")
    if (busy := unit_summary(c["noise"]))["busy"]:
        click.echo(f"BUSY: other processes used {busy['foreign_max']:.0%} of the cores while it measured: `harness "
                   "predict` gives no verdict on this calibration; take it again on a quiet machine", err=True)


@cli.command()
@click.argument("reference")
@click.argument("others", nargs=-1, required=True)
@click.option("--categories", help="Comma list of prompt categories (default: all).")
@click.option("--per-category", type=int, default=2, show_default=True)
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--threads", type=int, default=0)
def fidelity(reference, others, categories, per_category, max_tokens, threads):
    """What a lower quantization costs: alpha and top-1 agreement of OTHERS against REFERENCE, teacher-forced
    on REFERENCE's greedy output, next to bytes, tokens/s and peak RSS."""
    from harness.fidelity import fidelity_command
    click.echo(fidelity_command(reference, list(others), categories, per_category, max_tokens, threads))


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, callback=home)
@click.option("--out", default="reports/compare", show_default=True, callback=home,
              help="Where compare.md (and tables) go.")
@click.option("--format", "formats", default="md", show_default=True, help="Comma list: md, csv, json, parquet.")
def compare(run_dirs, out, formats):
    """Runs from several machines side by side: each one's verdict per category and policy, with its interval,
    after checking that they used the same models, prompts and policies."""
    from harness.compare.runs import compare_command
    say(str(compare_command(list(run_dirs), out, tuple(x.strip() for x in formats.split(",") if x.strip()))))


@cli.command(cls=Sectioned, first=("cal_paths", "out"), rest="Maintenance options")
@click.argument("run_dir", type=click.Path(file_okay=False), callback=home)
@click.option("--costs", "cal_paths", multiple=True, required=True, callback=home,
              help="A calibration file from the other machine (harness calibrate there), one per model; repeat.")
@click.option("--against", type=click.Path(file_okay=False), callback=home,
              help="A timed run on that machine, to check against.")
@click.option("--out", default="reports/predict", show_default=True, callback=home)
def predict(run_dir, cal_paths, against, out):
    """RUN_DIR's replayed acceptance with another machine's calibrated costs: that machine's predicted verdicts."""
    from harness.compare.predict import predict_command
    say(str(predict_command(run_dir, list(cal_paths), against, out)))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False), callback=home)
@click.option("--llama-server", "llama_server", callback=home,
              help="llama.cpp's llama-server binary (default: the one `make native` built, then llama-server on PATH).")
@click.option("--only", type=click.Choice(["all", "speculate"]), default="all", show_default=True,
              help="speculate: only the answers that say so; all: also every other verdict's best configuration.")
@click.option("--per-category", type=int, default=0, show_default=True,
              help="The first N of the run's prompts of each category (0 = every one the run used).")
@click.option("--port", type=int, help="The port on 127.0.0.1 the servers listen on in turn (default: a free one).")
@server_timeouts
@click.option("--redo", is_flag=True, help="Measure again the configurations crosscheck.json already holds.")
def crosscheck(run_dir, **opts):
    """Run the configurations RUN_DIR's answers name in llama.cpp's own llama-server, speculative and plain, on the
    run's prompts, and say whether each verdict holds there (RUN_DIR/crosscheck.md and crosscheck.json)."""
    from pathlib import Path

    from harness.crosscheck import crosscheck_command
    say(crosscheck_command(Path(run_dir), **opts))


@cli.command("server-check")
@click.argument("command")
@click.option("--category", default="code", show_default=True, help="The prompt category (prompts/<category>.jsonl).")
@click.option("--per-category", type=int, default=3, show_default=True, help="Its first N prompts.")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="Tokens per request.")
@click.option("--llama-server", "llama_server", callback=home, help="The binary to run (default: the command's own "
              "program where that path exists, else the one `make native` built, then llama-server on PATH).")
@server_timeouts
@click.option("--synth", type=int, default=0, help="Then N synthetic acceptance lengths (llama-server's "
              "--spec-synth-len): the acceptance at which the command's type pays here.")
def server_check(command, **opts):
    """Is speculation running in COMMAND, your own llama-server command line? Runs it and its --spec-type none twin
    on a category's prompts: whether it drafts, what it accepts and gains (95% interval). Exit 2: it drafts nothing."""
    from harness.crosscheck.servercheck import server_check_command
    text, code = server_check_command(command, **opts)
    say(text)
    sys.exit(code)


def main(argv: list[str] | None = None):
    """The console script; also callable in-process with argv (the tests do), exiting through SystemExit."""
    run_cli(cli, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
