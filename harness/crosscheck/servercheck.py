"""`harness server-check 'llama-server …'`: is speculation running in a user's own llama-server command line?

The command runs as given, and beside it its plain twin: the same flags with every speculative one removed and
`--spec-type none` added. Both run over the first prompts of a category (tokenized with the target's own vocabulary,
as the harness does), and one screen says whether the command drafts at all (the server's own draft_n summed over
its requests), what it accepts (draft_n_accepted / draft_n), and what it gains (the geometric mean of the
per-prompt speedups, with crosscheck.stats' 95% t interval), and whether greedy outputs were equal token for token.

What would make the measurement unfair or unsafe is changed, and the output says so: --host and --port are replaced
(127.0.0.1, a free port per start), an API key and TLS files are dropped (the harness is the only client), `-np 1`
is added where the command sets no -np, and every request sends `cache_prompt: false` (and temperature 0 unless the
command sets --temp). Every request goes to a server started for it, one server at a time; which of the two goes
first alternates from prompt to prompt (yours, plain; plain, yours; …: ABBA), so drift favours neither.

A command that drafts nothing is named as such, with the likeliest reason read from its flags: a draft model given
without --spec-type leaves this llama.cpp's type at none, so nothing is drafted (llama.cpp issue #25345)."""
from __future__ import annotations

import math
import os
import re
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from harness.analysis.verdict import MIN_GAIN, NO_GAIN, PLAIN, SPECULATE
from harness.crosscheck import binary as binary_mod
from harness.crosscheck.server import HOST, Server, free_port, why_line
from harness.analysis.serverstats import acceptance, reading, same_outputs, speedup
from harness.errors import HarnessError

# llama-server's speculative flags, from its --help ("speculative params", the draft's KV cache types, the lookup
# caches of ngram-cache, and the removed --draft-* ones). Every --spec-* flag takes one value except the switches
# below; the other aliases are listed whole.
SPEC_SWITCHES = frozenset({"--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft", "--spec-draft-backend-sampling",
                           "--no-spec-draft-backend-sampling", "--spec-default"})
SPEC_ALIASES = frozenset({
    "-hfd", "-hfrd", "--hf-repo-draft", "-td", "--threads-draft", "-tbd", "--threads-batch-draft", "-Cd",
    "--cpu-mask-draft", "-Crd", "--cpu-range-draft", "--cpu-strict-draft", "--prio-draft", "--poll-draft", "-Cbd",
    "--cpu-mask-batch-draft", "--cpu-strict-batch-draft", "--prio-batch-draft", "--poll-batch-draft", "-otd",
    "--override-tensor-draft", "-ncmoed", "--n-cpu-moe-draft", "--draft-p-split", "--draft-p-min", "-devd",
    "--device-draft", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "-md", "--model-draft", "--draft",
    "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "-ctkd", "--cache-type-k-draft", "-ctvd",
    "--cache-type-v-draft", "-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic"})
DRAFT_MODEL = ("-md", "--model-draft", "--spec-draft-model")
TARGET_MODEL = ("-m", "--model")
# dropped with their value: the harness listens on 127.0.0.1 at a port of its own and is the only client
DROPPED = {"--host": "the servers listen on 127.0.0.1", "--port": "a free port for each start",
           "--api-key": "the harness is the only client", "--api-key-file": "the harness is the only client",
           "--ssl-key-file": "plain HTTP on 127.0.0.1", "--ssl-cert-file": "plain HTTP on 127.0.0.1"}
VALUED = (*TARGET_MODEL, "-np", "--parallel", "--temp", "--temperature")
# a speculating server's complaint about its draft (a vocabulary not compatible with the target's, say)
COMPATIBLE = re.compile(r"\berror\b|GGML_ASSERT|not compatible|incompatible|must match", re.IGNORECASE)
SERVERS = ("llama-server", "llama-server.exe")
ROLES = {"speculative": "your command", "plain": "plain twin"}
EXAMPLE = "llama-server -m TARGET.gguf --spec-type draft-simple --spec-draft-model DRAFT.gguf"


def flag(word: str) -> str:
    """A word as llama.cpp matches it: a long flag's underscores read as hyphens."""
    return word.replace("_", "-") if word.startswith("--") else word


def speculative(name: str) -> bool:
    return name.startswith("--spec-") or name in SPEC_ALIASES or name in SPEC_SWITCHES


@dataclass
class Command:
    """A user's llama-server command line, split into what the two servers run."""
    program: str | None     # its first word, where it names one (None: the line starts with a flag)
    spec: list[str]         # the flags your command's server runs with (the binary and --host/--port left out)
    plain: list[str]        # the plain twin's
    target: str | None = None
    draft: tuple[str, str] | None = None   # (the flag as given, the file)
    types: list[str] = field(default_factory=list)   # --spec-type's values, comma lists split
    switches: list[str] = field(default_factory=list)  # --spec-default and the like
    temp: str | None = None
    changes: list[str] = field(default_factory=list)  # what the harness changed, in words

    def greedy(self) -> bool:
        """Temperature 0: sent by the harness, or the command's --temp at or below 0 (llama.cpp then samples
        greedily)."""
        if self.temp is None:
            return True
        try:
            return float(self.temp) <= 0
        except ValueError:
            return False


def parse(command: str) -> Command:
    """The command line split as a shell would, then into the speculative server's flags and its plain twin's; one
    line for a command that is not llama-server's or leaves a flag without its value. A word starting with ~ is
    expanded, as a shell would expand it unquoted (the servers are started without a shell)."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise HarnessError(f"the command cannot be split as a shell would ({e}): check its quotes") from None
    words = [os.path.expanduser(w) if w.startswith("~") else w for w in words]  # as a shell would, unquoted
    if not words:
        raise HarnessError(f"the command is empty: give your llama-server command line, e.g. '{EXAMPLE}'")
    program = None
    if not words[0].startswith("-"):
        program, words = words[0], words[1:]
        if os.path.basename(program) not in SERVERS:
            raise HarnessError(f"not a llama-server command: it runs {os.path.basename(program)!r}; give "
                               f"llama-server's own command line, e.g. '{EXAMPLE}'")
    c = Command(program, [], [])
    given_np = False
    k = 0
    while k < len(words):
        w, name = words[k], flag(words[k])
        takes = 0 if name in SPEC_SWITCHES else 1 if (speculative(name) or name in DROPPED or name in VALUED) else 0
        if takes and k + 1 >= len(words):
            raise HarnessError(f"the command ends with {w} and no value after it (llama-server would refuse it)")
        value = words[k + 1] if takes else None
        part = words[k:k + 1 + takes]
        k += 1 + takes
        if name in DROPPED:
            c.changes.append(f"{w} {value} dropped ({DROPPED[name]})")
            continue
        c.spec += part
        if speculative(name):
            if name == "--spec-type":
                c.types += [t.strip() for t in value.split(",") if t.strip()]
            elif name in DRAFT_MODEL:
                c.draft = (w, value)
            elif not takes:
                c.switches.append(w)
            continue
        c.plain += part
        if name in TARGET_MODEL:
            c.target = value
        elif name in ("-np", "--parallel"):
            given_np = True
        elif name in ("--temp", "--temperature"):
            c.temp = value
    if not given_np:
        c.spec += ["-np", "1"]
        c.plain += ["-np", "1"]
        c.changes.append("-np 1 added (one slot; requests go one at a time)")
    c.plain += ["--spec-type", "none"]
    return c


def check_files(c: Command) -> None:
    """The target (-m) is needed here to tokenize the prompts; it and the draft must be files, checked before any
    server starts."""
    if c.target is None:
        raise HarnessError("the command names no model file (-m FILE): server-check tokenizes the prompts with the "
                           "target's own vocabulary, so it needs the target's file here (a -hf download will not do)")
    for what, path in (("model file", ("-m", c.target)), ("draft model file", c.draft)):
        if path is None:
            continue
        given, p = path[0], Path(path[1])
        if not p.exists():
            raise HarnessError(f"the command's {what} {path[1]} ({given}) does not exist")
        if not p.is_file():
            raise HarnessError(f"the command's {what} {path[1]} ({given}) is not a file")


def pick_binary(given: str | None, program: str | None) -> tuple[Path, str]:
    """(the llama-server to run, a note where it is not the one the command names): --llama-server PATH, else the
    command's own program where it is a path to an executable file, else the harness's (binary.find)."""
    if given:
        return binary_mod.find(given), ""
    if program and os.sep in program:
        p = Path(program)
        if p.is_file() and os.access(p, os.X_OK):
            return p, ""
        found = binary_mod.find(None)
        return found, f"the command's {program} is not an executable file here: ran {found} instead"
    return binary_mod.find(None), ""


def body(tokens: list[int], max_tokens: int, c: Command) -> dict:
    """/completion's body: the prompt as token ids, no prompt cache, temperature 0 unless the command sets --temp
    (then the server's own sampling settings apply)."""
    out = {"prompt": tokens, "n_predict": max_tokens, "cache_prompt": False, "stream": False, "return_tokens": True}
    return out if c.temp is not None else out | {"temperature": 0.0}


def measure(binary: Path, c: Command, prompts: list, log_dir: Path, start_timeout: float, request_timeout: float,
            extra: list[dict] | None = None, on_start=None, on_prompt=None, roles: dict = ROLES,
            skip: set[int] = frozenset()) -> list[dict]:
    """Per prompt, your command's and the plain twin's timings, each from a server started for that request and
    stopped after it; your command first on the 1st, 3rd, … prompt, the plain twin first on the others.
    extra: per prompt, further fields of both its requests (harness bench's seed); on_start(pid): told each
    server's pid as it starts; on_prompt(record): told each prompt's pair as it finishes (default: a line);
    skip: the indices of prompts measured already (bench's resumed unit), left out without changing the order."""
    from harness.crosscheck.run import ask
    out = []
    for k, (pid, tokens, mt) in enumerate(prompts):
        if k in skip:
            continue
        rec = {"id": pid, "n_prompt": len(tokens), "max_tokens": mt}
        order = ("speculative", "plain") if k % 2 == 0 else ("plain", "speculative")
        for key in order:
            srv = Server(binary, c.spec if key == "speculative" else c.plain, free_port(),
                         log_dir / f"{k + 1:02d}-{pid}-{key}.log", roles[key], on_spawn=on_start)
            try:
                srv.start(start_timeout)
                rec[key] = ask(srv, pid, body(tokens, mt, c) | (extra[k] if extra else {}), request_timeout)
            finally:
                srv.stop()
        (on_prompt or _say)(rec)
        out.append(rec)
    return out


def _say(rec: dict) -> None:
    s = rec["speculative"]
    click.echo(f"server-check: {rec['id']}: yours {tok_s([rec], 'speculative'):.1f} tok/s (drafted {s['draft_n']}, "
               f"accepted {s['draft_n_accepted']}), plain {tok_s([rec], 'plain'):.1f} tok/s", err=True)


def tok_s(prompts: list[dict], key: str) -> float:
    """Generated tokens per second over all prompts, as llama-server counts its predicted_per_second (the first
    token, from the prompt's logits, left out)."""
    n = sum(max((p[key]["predicted_n"] or 0) - 1, 0) for p in prompts)
    ms = sum(p[key]["predicted_ms"] or 0.0 for p in prompts)
    return 1000.0 * n / ms if ms > 0 else math.nan


def why_not(c: Command, log_dir: Path) -> tuple[str, str]:
    """(why, fix) for a command that drafted nothing, read from its flags."""
    real = [t for t in c.types if t != "none"]
    if "--spec-default" in c.switches:
        real = real or ["ngram-mod"]  # --spec-default's type
    if "none" in c.types and not real:
        return (f"the command sets --spec-type {','.join(c.types)}, which turns speculation off",
                "give --spec-type a type" + (" (draft-simple for its draft model)" if c.draft else ""))
    if not real:
        if c.draft:
            return (f"the command gives a draft model ({c.draft[0]} {c.draft[1]}) but no --spec-type: in this "
                    "llama.cpp the type then stays none, so the draft model is loaded and never used (llama.cpp "
                    "issue #25345)", "add `--spec-type draft-simple`")
        return ("the command names no speculative type (--spec-type) and no draft model",
                "add `--spec-type draft-simple --spec-draft-model DRAFT.gguf`, or `--spec-type ngram-mod` (no draft "
                "model needed)")
    if "draft-simple" in real and not c.draft:
        return ("the command sets --spec-type draft-simple but gives no draft model for it to draft with",
                "add `--spec-draft-model DRAFT.gguf` (a smaller model sharing the target's tokenizer; `harness "
                "drafts TARGET` lists them)")
    if all(t.startswith("ngram") for t in real):
        return (f"--spec-type {','.join(real)} drafts only where the output repeats an n-gram seen before, and these "
                "outputs did not", "try a category whose answers repeat their prompt (grounded, long_context), "
                "smaller n-gram sizes, or a draft model")
    said = next((line for f in sorted(log_dir.glob("*-speculative.log")) if (line := why_line(f, COMPATIBLE))), "")
    if said:  # a draft model the server refused (not compatible with the target), say
        return f"--spec-type {','.join(real)} drafted nothing; the server's log says: {said}", \
            f"fix what it names (the servers' logs are in {log_dir})"
    if c.draft and (differs := foreign_tokenizer(c)):  # a server that drafts nothing with it and says nothing
        return (f"--spec-type {','.join(real)} drafted nothing, and the draft model {c.draft[1]} does not share the "
                f"target's tokenizer ({differs})", f"give {c.draft[0]} a draft of the target's family (`harness "
                "drafts TARGET` lists them; `harness check TARGET DRAFT` shows the difference)")
    return f"--spec-type {','.join(real)} drafted nothing on these prompts", f"read the servers' logs in {log_dir}"


def foreign_tokenizer(c: Command) -> str | None:
    """The first way the draft's tokenizer differs from the target's (align.check_pair); None where they agree or
    cannot be read here."""
    from harness.align import MISALIGNED, check_pair
    try:
        report = check_pair(Path(c.target), Path(c.draft[1]))
    except HarnessError:
        return None
    return report["reasons"][0] if report["verdict"] == MISALIGNED and report["reasons"] else None


def speed_words(lo: float | None, hi: float | None) -> str:
    """What the speedup's interval says, by the harness's rule at its default least gain worth having."""
    r = reading(lo, hi, MIN_GAIN)
    if r == SPECULATE:
        return f"faster than plain, by more than the {MIN_GAIN:.0%} worth having"
    if r == PLAIN:
        return "slower than plain"
    if r == NO_GAIN:
        return f"no gain worth having (under {MIN_GAIN:.0%})"
    return "one prompt gives no interval" if lo is None else "unsettled: more prompts would tell"


def render(c: Command, binary: Path, version: str, note: str, category: str, prompts: list[dict],
           log_dir: Path, took_s: float, load: tuple[float, float]) -> tuple[str, bool]:
    """The one screen, and whether the command speculates."""
    from harness.report.fmt import ci, pct_ci
    n = len(prompts)
    a, s = acceptance(prompts), speedup(prompts)
    drafts = a["drafted"]
    lines = []
    if drafts > 0:
        lines += [f"## Is speculation running? Yes: it drafted {drafts} tokens over {n} requests "
                  f"({drafts / n:.1f} a request)", "",
                  f"- Acceptance: {pct_ci(a['acceptance'], a['acceptance_lo'], a['acceptance_hi'])} "
                  f"({a['accepted']} of {drafts} drafted tokens accepted)"]
    else:
        why, fix = why_not(c, log_dir)
        lines += [f"## Is speculation running? No: it does not speculate: drafted 0 tokens over {n} requests", "",
                  f"- Why: {why}", f"- Fix: {fix}", "- Acceptance: - (nothing drafted)"]
    lines += [f"- Speed: {tok_s(prompts, 'speculative'):.1f} tok/s yours, {tok_s(prompts, 'plain'):.1f} tok/s plain "
              "(generation, the servers' own timings)",
              f"- Speedup: {ci(s['speedup'], s['lo'], s['hi'], unit='x')} over {s['prompts']} prompts, 95% "
              f"interval: {speed_words(s['lo'], s['hi'])}"]
    twin = sum((p["plain"].get("draft_n") or 0) for p in prompts)
    if twin:
        lines.append(f"- The plain twin drafted {twin} tokens too: something outside the command (LLAMA_ARG_* "
                     "environment variables?) turns speculation on, so this speedup is not against plain decoding")
    if c.greedy():
        same, compared = same_outputs(prompts)
        how = "temperature 0 sent with every request" if c.temp is None else f"--temp {c.temp} in the command"
        lines.append(f"- Outputs: greedy ({how}): equal token for token on {same} of {compared} prompts"
                     + ("" if same == compared else " (llama.cpp verifies by exact match, so a difference is a "
                        "kernel near-tie or a bug)"))
    else:
        lines.append(f"- Outputs: not compared: sampled at --temp {c.temp} (the command's), where speculative and "
                     "plain outputs may differ")
    mt = sorted({p["max_tokens"] for p in prompts})
    lines += [f"- Prompts: the first {n} of category {category}, at most {'/'.join(map(str, mt))} tokens each, "
              "cache_prompt false",
              "- Order: every request on a server started for it, one server at a time; yours first on the 1st, 3rd, "
              "… prompt, plain first on the others (ABBA), so drift favours neither",
              f"- Took {took_s:.1f} s ({2 * n} server starts); load average {load[0]:.2f} before, {load[1]:.2f} after",
              "", "Commands run (PORT: a free one for each start):",
              "  yours: " + shlex.join([str(binary), *c.spec, "--host", HOST, "--port", "PORT"]),
              "  plain: " + shlex.join([str(binary), *c.plain, "--host", HOST, "--port", "PORT"])]
    changes = ([note] if note else []) + c.changes
    if changes:
        lines.append("Changed from yours: " + "; ".join(changes))
    lines.append(f"llama-server {version.removeprefix('version: ')}; servers' logs in {log_dir}")
    return "\n".join(lines), drafts > 0


def server_check_command(command: str, llama_server: str | None = None, category: str = "code",
                         per_category: int = 3, max_tokens: int = 64, start_timeout: float = 300.0,
                         request_timeout: float = 600.0, synth: int = 0) -> tuple[str, int]:
    """The screen to print and the exit code: 0 where the command drafts, 2 where it drafts nothing. synth: that
    many synthetic acceptance lengths measured after (crosscheck.synth), 0 for none."""
    from harness import prompts as prompts_mod
    from harness.crosscheck.checks import tokenize
    from harness.llamacpp import NoChatTemplate
    from harness.procs import stop_on_signals
    if per_category < 1:
        raise HarnessError(f"--per-category must be 1 or more, got {per_category}")
    if max_tokens < 2:
        raise HarnessError(f"--max-tokens must be 2 or more (a speed needs two tokens), got {max_tokens}")
    for name, v in (("--start-timeout", start_timeout), ("--request-timeout", request_timeout)):
        if not math.isfinite(v) or v <= 0:
            raise HarnessError(f"{name} must be a number of seconds above 0, got {v:g}")
    c = parse(command)
    check_files(c)
    binary, note = pick_binary(llama_server, c.program)
    version = binary_mod.version(binary)
    if synth:
        from harness.crosscheck import synth as synth_mod
        given = {flag(w): v for w, v in zip(c.spec, c.spec[1:])}
        longest = synth_mod.check(c.types, given, binary_mod.known_flags(binary))
        synth_mod.lengths(longest, synth)  # a bad count says so before anything runs
    chosen = prompts_mod.load([category], per_category=per_category)
    try:
        tokens = tokenize(Path(c.target), chosen, max_tokens)
    except NoChatTemplate as e:  # its prompts are the harness's chat conversations: no raw text to switch to
        raise HarnessError(f"{c.target} (-m) cannot render server-check's prompts ({e.args[0].split(';')[0]}): they "
                           f"are chat conversations (prompts/{category}.jsonl); give -m an instruct model with a "
                           "chat template") from None
    log_dir = Path(tempfile.mkdtemp(prefix="harness-server-check-"))
    load0, t0 = os.getloadavg()[0], time.monotonic()
    with stop_on_signals():
        measured = measure(binary, c, tokens, log_dir, start_timeout, request_timeout)
        took = time.monotonic() - t0
        text, speculates = render(c, binary, version, note, category, measured, log_dir, took,
                                  (load0, os.getloadavg()[0]))
        if synth:
            rows = synth_mod.run(lambda cmd, d: measure(binary, cmd, tokens, d, start_timeout, request_timeout,
                                                        on_prompt=lambda rec: None), c, log_dir, synth, longest)
            text += "\n" + "\n".join(synth_mod.render(rows, acceptance(measured)["acceptance"], longest))
    return text, 0 if speculates else 2
