"""The bottom line, first on the report and in answer.json: per target model file, what to do on this machine in
one line, in tokens/s plain and with the configuration it names, the gain with its interval and what it rests on;
where the configuration ran in llama-server, the figure of that engine, whose command the line prints, decides. Then
the targets side by side (speculation against quantization), and the categories and policies whose answer differs.
Pure: it reads the answers (report.answer) and the sweep's plain baselines."""
from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl

from harness.analysis.serverstats import reading
from harness.analysis.verdict import INCONCLUSIVE, NO_GAIN, PLAIN, SETTLED, SPECULATE
from harness.report.fmt import ci, table

REACH = 5  # "about N more prompts would settle it" only where N is at most this many times the prompts measured
MIN_INTERVAL = 3  # fewer prompts give per-prompt figures, not an interval
SHORT_OUTPUT = 128  # outputs shorter than a typical answer: said on the first screen
WHERE = ("target", "ngl", "threads", "setup")
DONT = "don't speculate"


def plain_pace(sweep: pl.DataFrame | None, a: dict) -> float | None:
    """Tokens/s of the plain baseline of an answer's target, setting and policy over every prompt it ran (tokens
    over time, every category at once)."""
    if sweep is None or not len(sweep):
        return None
    rows = sweep.filter((pl.col("draft") == "none") & (pl.col("policy") == a["policy"])
                        & pl.all_horizontal(*(pl.col(k) == a[k] for k in WHERE if k in sweep.columns)))
    ms = rows["gen_ms"].sum() if len(rows) else 0
    return rows["tokens"].sum() * 1000 / ms if ms else None


def peak(sweep: pl.DataFrame | None, a: dict, draft: str | None) -> int | None:
    """The peak RSS of the workers of an answer's target and setting: the plain one's (draft None) or those of the
    configuration's draft."""
    if sweep is None or not len(sweep) or "peak_rss_bytes" not in sweep.columns:
        return None
    rows = sweep.filter((pl.col("draft") == (draft or "none"))
                        & pl.all_horizontal(*(pl.col(k) == a[k] for k in WHERE if k in sweep.columns)))
    return rows["peak_rss_bytes"].max() if len(rows) else None


def engine_figure(a: dict) -> dict:
    """The figure the bottom line gives, from the engine its command runs: llama-server's where it measured the
    configuration on enough prompts to give an interval, else the harness's loop (labelled as such). A verdict
    the harness withheld (busy or contradicted evidence) stays withheld; one it could not settle, llama-server's
    own interval may."""
    n = a.get("server_prompts") or 0
    if a.get("server_speedup") is not None and n >= MIN_INTERVAL:
        v = a["verdict"] if a["verdict"] not in (*SETTLED, INCONCLUSIVE) else \
            reading(a["server_lo"], a["server_hi"], a["min_gain"])
        return {"engine": "llama-server", "speedup": a["server_speedup"], "lo": a["server_lo"], "hi": a["server_hi"],
                "verdict": v, "plain": a.get("server_plain_tps"), "prompts": n}
    # --engine server timed llama-server itself
    return {"engine": "llama-server" if a.get("engine") == "server" else "harness", "speedup": a["speedup"],
            "lo": a["lo"], "hi": a["hi"], "verdict": a["verdict"], "plain": a.get("plain_tokens_per_s"),
            "prompts": a.get("prompts"), "adjusted": a.get("adjusted"), "own": a.get("engine") == "server"}


def further(a: dict) -> str:
    """What would settle an inconclusive answer, in words: the further prompts where they are within reach."""
    n, had = a.get("further"), a.get("prompts") or 0
    if n is not None and had and n <= REACH * had:
        return f"about {n} more prompt{'s' * (n > 1)} would settle it"
    return "the gain, if any, is too small for this many prompts to settle"


def per_prompt(ratios: list[float] | None) -> str:
    """'2 prompts: 1.87x, 0.99x': what a figure of fewer than MIN_INTERVAL prompts shows instead of an interval."""
    rs = ratios or []
    return f"{len(rs)} prompt{'s' * (len(rs) != 1)}: " + ", ".join(f"{x:.2f}x" for x in rs)


def _pace(plain: float | None, x: float | None) -> str:
    return "" if plain is None else f"{plain:.1f} tok/s" if x is None else f"{plain:.1f} → {plain * x:.1f} tok/s"


def sentence(a: dict) -> str:
    """The bottom line of one target and policy, in the engine of its command, the harness's own loop's figure
    beside it, labelled."""
    e = engine_figure(a)
    rest = f"{e['prompts']} prompt{'s' * (e['prompts'] != 1)}" if e["prompts"] else ""
    in_server = "" if e["engine"] != "llama-server" else " in llama-server" if e.get("own") else \
        f" in llama-server over {rest}"
    gain = ci(e["speedup"], e["lo"], e["hi"], unit="x") + "*" * bool(e.get("adjusted"))
    if e["verdict"] == SPECULATE:
        line = f"**speculate** with {a['configuration']}: {_pace(e['plain'], e['speedup'])}{in_server}, {gain}"
    elif e["verdict"] == NO_GAIN:
        line = (f"**{DONT}**: plain {_pace(e['plain'], None)}; the best speculative setup ({a['configuration']}, "
                f"{gain}{in_server}) gains nothing worth having")
    elif e["verdict"] == PLAIN:
        line = (f"**{DONT}**: plain {_pace(e['plain'], None)}; every speculative setup loses (best "
                f"{a['configuration']}, {gain}{in_server})")
    elif e["verdict"] == INCONCLUSIVE:
        settle = further(a) if e["engine"] == "harness" else "more prompts in llama-server would tell"
        line = (f"**inconclusive**: plain {_pace(e['plain'], None)}; best {a['configuration']}, {gain}{in_server}: "
                f"{settle}")
    else:
        return f"**no verdict** ({e['verdict']}): {a.get('why') or 'see the answers per category'}"
    if e.get("own"):  # the run's own engine was llama-server
        line += f" ({source(a)})"
    elif e["engine"] == "llama-server":
        own = ci(a["speedup"], a["lo"], a["hi"], unit="x")
        differs = "" if e["verdict"] == a["verdict"] else f"; it said {a['verdict']}: llama-server's figure decides"
        line += f". The harness's own loop: {own}, {source(a)}{differs}"
    else:
        line += f" (the harness's own loop, {source(a)}"
        line += f"; in llama-server {per_prompt(a['server_ratios'])}, too few for an interval)" \
            if a.get("server_speedup") is not None else "; not run in llama-server)"
    if e["verdict"] == SPECULATE and a.get("accepted_len") is not None:
        line += (f". {a['accepted_len']:.2f} drafts accepted a step ({a['accepted_len'] + 1:.2f} tokens a step as "
                 "llama.cpp and vLLM count it)")
    return line


def source(a: dict) -> str:
    """What an answer's figure rests on: 'predicted from 60 prompts', 'timed on 5 prompts'."""
    n = a.get("prompts") or 0
    how = "timed on" if (a.get("source") or "").startswith("timed") else "predicted from"
    return f"{how} {n} prompt{'s' * (n != 1)}"


def references(a: dict) -> str:
    """The plain paces behind a bottom line's speedup, side by side: the baseline's, the paired twins' (the
    reference where the run paired them) and llama-server's plain twins' where it ran there; '' with fewer than
    two."""
    said = [(what, x) for what, x in (("baseline", a.get("plain_tokens_per_s")), ("twins", a.get("twin_tokens_per_s")),
                                       ("llama-server", a.get("server_plain_tps"))) if x]
    return ", ".join(f"{what} {x:.1f}" for what, x in said) if len(said) > 1 else ""


def differs(rows: list[dict], bottom: dict) -> list[dict]:
    """The per-category answers of a bottom line's target, setting and policy whose verdict is not its own."""
    return [r for r in rows if all(r[k] == bottom[k] for k in (*WHERE, "policy"))
            and r["verdict"] != engine_figure(bottom)["verdict"]]


def source_of(m: dict) -> str | None:
    """The model a plan's model facts say this one was derived from (older plans say it in their note alone)."""
    if m.get("derived_from"):
        return m["derived_from"]
    found = re.match(r"requantized from (\S+) \(", m.get("note") or "")
    return found.group(1) if found else None


def _name(a: dict, models: dict) -> str:
    m = models.get(a["target"], {})
    return f"`{a['target']}`" + (f" ({m['quant']}, {gib(m['bytes'])})" if m.get("quant") and m.get("bytes") else "")


def section(bottom: list[dict], rows: list[dict], models: dict, commands) -> list[str]:
    """The bottom line's lines: per target, its first policy's line, and each other policy's where it differs; under
    each, the categories whose settled answer differs, and in one line those too close to call alone; then the
    command of each "speculate" (commands(a) -> lines)."""
    if not bottom:
        return []
    out = ["## The bottom line"]
    by_target: dict[tuple, list[dict]] = {}
    for b in bottom:
        by_target.setdefault(tuple(b[k] for k in WHERE), []).append(b)
    for group in by_target.values():
        first = group[0]
        same = [b["policy"] for b in group[1:] if engine_figure(b)["verdict"] == engine_figure(first)["verdict"]]
        out.append(f"- {_name(first, models)}, {' and '.join([first['policy'], *same])}: {sentence(first)}.")
        open_ = []
        for b in group:
            if b is not first and b["policy"] not in same:
                out.append(f"  - {b['policy']}: {sentence(b)}.")
            cats = []
            for r in differs(rows, b):
                if r["verdict"] == INCONCLUSIVE:
                    cats.append(r["category"])
                    continue
                out.append(f"  - {r['category']}, {r['policy']} alone: {r['verdict']} ({r['configuration'] or 'none'}, "
                           f"{ci(r['speedup'], r['lo'], r['hi'], unit='x')}, {r['prompts']} prompts).")
            if cats:
                open_.append(f"{', '.join(cats)} ({b['policy']})")
        if open_:
            out.append(f"  - Too close to call on their own prompts: {'; '.join(open_)}.")
        if (x := faster(first, bottom, models)) is not None:
            out.append(f"  - **Slower than {x}: prefer that.")
    out.append("")
    return out + [x for b in bottom for x in commands(b)]


def best_pace(b: dict) -> float | None:
    """Tokens/s of what a bottom line says to do: speculating where it says speculate, else plain decoding."""
    e = engine_figure(b)
    if e["plain"] is None:
        return None
    return e["plain"] * e["speedup"] if e["verdict"] == SPECULATE and e["speedup"] else e["plain"]


def faster(b: dict, bottom: list[dict], models: dict) -> str | None:
    """Where another target of the run, under the same policy, run plainly beats what b's bottom line says to do
    (a lower precision's plain pace against a higher one's speculation): it, in words; None where none does."""
    mine = best_pace(b)
    rivals = [o for o in bottom if o["target"] != b["target"] and o["policy"] == b["policy"]
              and o["plain_tokens_per_s"] and mine and engine_figure(o)["plain"] > mine]
    if not rivals:
        return None
    o = max(rivals, key=lambda o: engine_figure(o)["plain"])
    same = source_of(models.get(b["target"]) or {}) == o["target"]
    targets = list(dict.fromkeys(x["target"] for x in bottom))
    return (f"{label(o['target'], models, targets)} run plainly** ({engine_figure(o)['plain']:.1f} tok/s against "
            f"{mine:.1f})" + (", its source, of the same quality" if same else ""))


def short(config: str, target: str) -> str:
    """A configuration's name without what it shares with its target's ('0.5b-instruct-q4_0 γ 3' for a draft of
    the same family), to keep a table narrow."""
    common = os.path.commonprefix([config, target])
    cut = common.rfind("-") + 1
    return config[cut:] if cut > 4 else config


def quantization(bottom: list[dict], models: dict, sweep: pl.DataFrame | None) -> list[str]:
    """The targets side by side where a run holds several: size, peak RAM, plain tok/s, the best speculative
    configuration and its tok/s with its gain; the fastest configuration overall per policy, whether a lower
    precision run plainly beats a higher one's speculation, and which targets share a source."""
    targets = list(dict.fromkeys(b["target"] for b in bottom))
    if len(targets) < 2:
        return []
    several = len({b["policy"] for b in bottom}) > 1
    rows, best = [], {}
    for b in bottom:
        e = engine_figure(b)
        plain, spec = e["plain"], e["plain"] * e["speedup"] if e["plain"] and e["speedup"] else None
        m = models.get(b["target"], {})
        rows.append([m.get("quant") or b["target"], *([b["policy"]] if several else []),
                     gib(m.get("bytes")), gib(peak(sweep, b, None)),
                     f"{plain:.1f}" if plain else "", short(b["configuration"] or "none", b["target"]),
                     f"{spec:.1f}" if spec else "", ci(e["speedup"], e["lo"], e["hi"], unit="x") +
                     "*" * bool(e.get("adjusted")) + ("" if e["engine"] == "harness" else " (server)")])
        use = best_pace(b)
        if use and (b["policy"] not in best or use > best[b["policy"]][0]):
            best[b["policy"]] = (use, b)
    head = ["quant", *(["policy"] if several else []), "size", "peak RAM", "plain", "speculative", "tok/s",
            "gain [95% CI]"]
    out = ["## Speculation against quantization", table(rows, head), "",
           "Tok/s plain and speculating, in the harness's own loop unless marked (server); peak RAM: the plain "
           "worker's."]
    out.append("Fastest here: " + "; ".join(
        f"{f'under {pol}, ' if several else ''}{label(b['target'], models, targets)} "
        f"{b['configuration'] if engine_figure(b)['verdict'] == SPECULATE else 'run plainly'}, {tps:.1f} tok/s"
        for pol, (tps, b) in best.items()) + ".")
    shared = [(t, s) for t in targets if (s := source_of(models.get(t) or {})) in targets]
    said = {b["target"] for b in bottom if "its source" in (faster(b, bottom, models) or "")}  # in its bottom line
    out += [f"{label(t, models, targets)} is derived from {label(s, models, targets)}: it has its source's quality, "
            "no better." for t, s in shared if t not in said]
    return out + [""]


def commands(b: dict) -> list[str]:
    """Under a "speculate" bottom line: the llama-server command that gives it, where the llama-server measured
    lives and its version, and for a draft model LM Studio's settings (it runs the same llama.cpp)."""
    if engine_figure(b)["verdict"] != SPECULATE or not b.get("server"):
        return []
    said = "" if b.get("server_binary") else " (not measured there; `make native` builds it)"
    out = [f"`{b['target']}`, {b['policy']}, in llama-server{said}:", "```sh", b["server"], "```"]
    if b.get("server_binary"):
        home = str(Path.home())
        where = b["server_binary"].replace(home, "~", 1) if b["server_binary"].startswith(home) else b["server_binary"]
        out.append(f"The llama-server measured: `{where}` (`make native`'s build), {b.get('server_tool') or ''}.")
    inst = b.get("instance")
    if inst is not None and inst.draft.model and not inst.draft.server_only:
        out.append(f"In LM Studio (the same llama.cpp): Speculative Decoding, Draft Model {inst.draft.model}, "
                   f"Max Draft Size {inst.gamma}, Min Draft Size {inst.n_min}, Drafting Probability Cutoff "
                   f"{inst.p_min:g}.")
    return out + [""]


def gib(v) -> str:
    return "" if not v else f"{v / 2**30:.1f} GiB"


def label(target: str, models: dict, targets: list[str]) -> str:
    """A target by its quantization where that tells the run's targets apart, else by its name."""
    quants = [(models.get(t) or {}).get("quant") for t in targets]
    q = (models.get(target) or {}).get("quant")
    return q if q and len(set(quants)) == len(quants) else f"`{target}`"


def evidence(plan: dict, sweep: pl.DataFrame | None, bottom: list[dict]) -> list[str]:
    """What the answers rest on, in a line: prompts, output length, policies per target, and the run's time spent
    generating plainly (its evidence) against its whole; a warning where outputs are shorter than a typical answer
    or a target was measured under one policy only."""
    p, models = plan.get("params", {}), plan.get("models", {})
    cuts = {c["param"]: c for c in (plan.get("budget") or {}).get("cuts", [])}
    tokens = p.get("max_tokens") or 0
    cut = f" (cut from {cuts['max_tokens']['before']} by the budget)" if "max_tokens" in cuts else ""
    n = max((b.get("prompts") or 0 for b in bottom), default=0)
    pols: dict[str, list[str]] = {}
    for b in bottom:
        pols.setdefault(b["target"], []).append(b["policy"])
    said = "; ".join(f"{label(t, models, list(pols))} {' and '.join(ps)}" for t, ps in pols.items())
    plain_s = sweep.filter(pl.col("draft") == "none")["gen_ms"].sum() / 1000 if sweep is not None and len(sweep) \
        else 0
    took = (plan.get("took_s") or {}).get("total")
    time = f"; plain generation took {plain_s / 60:.1f} of the run's {took / 60:.1f} min" if took \
        else ""
    length = f"{tokens}-token outputs{cut}" if tokens else "each prompt's own output length"
    if chars := p.get("prompt_chars"):
        length += f", prompts cut in the middle to {chars} characters{' by the budget' * ('prompt_chars' in cuts)}"
    out = [f"Evidence: {n} prompts, {length}; {said}{time}."]
    one = [label(t, models, list(pols)) for t, ps in pols.items() if len(ps) == 1]
    short_ = tokens and tokens < SHORT_OUTPUT
    warn = ([f"**short outputs** ({tokens} < {SHORT_OUTPUT} tokens)"] if short_ else []) \
        + ([f"**one policy** for {', '.join(one)}"] if one else [])
    if warn:
        differ = " or ".join(["longer"] * bool(short_) + ["sampled"] * bool(one))
        out.append(f"Mind the {' and '.join(warn)}: {differ} outputs may differ.")
    refs = [f"{label(b['target'], models, list(pols))} {b['policy']}: {x}" for b in bottom if (x := references(b))]
    if refs:
        timed = {(b.get("source") or "").startswith("timed") for b in bottom}
        against = ["Timed speedups are against the paired twins where the run paired them, else the baseline."] \
            * (True in timed) + ["Predictions price plain decoding at the baseline's pace."] * (False in timed) \
            + ["llama-server's figures are against its own plain twins."] * any(
                engine_figure(b)["engine"] == "llama-server" for b in bottom)
        out.append("Plain references, tok/s: " + "; ".join(refs) + ". " + " ".join(against))
    if any(engine_figure(b).get("adjusted") for b in bottom):
        out.append("*: the interval widened for having picked the best of the configurations tried.")
    return out + [""]
