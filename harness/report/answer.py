"""The answer in words, first on the report's first screen and in answer.json: one line per category and policy
(per target and setting where a run sweeps several), the configuration to use with its interval, and beside every
"speculate" the command that gives it in llama.cpp."""
from __future__ import annotations

import shlex
from dataclasses import replace

import polars as pl

from harness.analysis.verdict import INCONCLUSIVE, NO_GAIN, PLAIN, SETTLED, SPECULATE
from harness.models.arch import implications, words
from harness.report.bottomline import MIN_INTERVAL, engine_figure, per_prompt, plain_pace
from harness.report.fmt import beside, ci
from harness.howto import howto, rule_differs
from harness.checkrows import UNMEASURED
from harness.report.llamaserver import spec_flags
from harness.report.replayed import best_fixed, confirmation
from harness.report.verdicts import GROUP, LEVEL_REPLAY
from harness.specs import parse_draft

VARY = ("target", "ngl", "threads", "setup")


def answers(data: dict[str, pl.DataFrame], plan: dict, pooled: bool = False) -> list[dict]:
    """One dict per group: where (target, ngl, threads, setup, category, policy), the verdict, the configuration
    it names and its figures, what it rests on (predicted from every prompt, or timed) with its timed check and,
    for speculate, how to run it in llama.cpp (howto) with, where llama.cpp's rule differs from the one
    measured, the figure of llama.cpp's rule beside. A prediction its own timed run contradicts is no answer:
    the group's timed verdict decides where it settled, else the group is inconclusive. pooled: the answers over
    every category at once (category "all", the bottom line's), where the run has a replay; else none."""
    from harness.instance import Instance
    by_id = {i.id: i for i in (Instance.from_dict(d) for d in plan.get("instances", []))}
    n_ctx = plan.get("params", {}).get("n_ctx", 2048)
    v, sweep = data.get("verdicts"), data.get("sweep")
    replay = data.get("pooled_verdicts" if pooled else "replay_verdicts")
    engine = {"engine": plan.get("params", {}).get("engine") or "harness"}
    if pooled and (replay is None or not len(replay)):  # a timed run's: over every category at once
        v, sweep = data.get("timed_pooled_verdicts"), data.get("sweep_pooled")
    elif replay is not None and len(replay):
        timed = {} if v is None or not len(v) else {tuple(r[k] for k in GROUP): r for r in v.iter_rows(named=True)}
        out = []
        server = data.get("llama_server")
        for r in replay.iter_rows(named=True):
            a, ran = _predicted(r, data["replay_pooled" if pooled else "replay"], by_id, n_ctx)
            check = confirmation(r | ran)  # of the configuration its commands run
            if not check.startswith("CONTRADICTED"):
                out.append(a | {"check": check})
                continue
            said = (f"predicted {r['verdict']} ({r['proposer']} γ {r['gamma']}, "
                    f"{ci(r['speedup'], r['lo'], r['hi'], unit='x')}), but its timed run contradicted it "
                    f"({check.removeprefix('CONTRADICTED: ')})")
            t = timed.get(tuple(r[k] for k in GROUP))
            if t is not None and t["verdict"] in SETTLED:
                out.append(_timed(t, by_id, n_ctx, sweep) | {"check": said + ": the timed run decides"})
            else:
                out.append(_answer(r | {"verdict": INCONCLUSIVE, "further": None}, "", None,
                                   "predicted from every prompt", n_ctx, pl.DataFrame()) | {"check": said})
        if pooled:  # per target (in the plan's order), greedy first
            first = list(dict.fromkeys(a["target"] for a in out))
            out.sort(key=lambda a: (first.index(a["target"]), a["policy"] != "greedy"))
        return [_in_server(a, server, n_ctx) | paces(sweep, a) | engine for a in out]
    if v is None or not len(v):
        return []
    timed = [_timed(r, by_id, n_ctx, sweep) | {"check": ""} for r in v.iter_rows(named=True)]
    return [_in_server(a, data.get("llama_server"), n_ctx) | paces(sweep, a) | engine for a in timed]


def paces(sweep: pl.DataFrame | None, a: dict) -> dict:
    """The plain paces beside an answer: its baseline's over every prompt, and its configuration's paired plain
    twins' where it ran beside them (the speedup's reference then)."""
    twins = None
    rows = sweep.filter(pl.col("config") == a["instance"].id) if sweep is not None and len(sweep) and \
        a.get("instance") is not None and "paired_tokens_per_ms" in sweep.columns else None
    if rows is not None and len(rows := rows.drop_nulls("paired_tokens_per_ms")):
        twins = rows["tokens"].sum() / (rows["tokens"] / rows["paired_tokens_per_ms"]).sum() * 1000
    return {"plain_tokens_per_s": plain_pace(sweep, a), "twin_tokens_per_s": twins}


SERVER_KEYS = ("server_flags", "server_speedup", "server_lo", "server_hi", "server_acceptance", "server_reading",
               "server_holds", "server_prompts", "server_same", "server_compared", "server_skip", "server_plain_tps",
               "server_ratios", "server_tool", "server_binary")


def _in_server(a: dict, server: pl.DataFrame | None, n_ctx: int) -> dict:
    """The answer with its configuration's figures as measured in llama-server (crosscheck.json's row of the same
    configuration and category), None each where it was not."""
    inst = a.get("instance")
    rows = server.filter((pl.col("config") == inst.id) & (pl.col("category") == a["category"])) \
        if server is not None and inst is not None else None
    x = rows.row(0, named=True) if rows is not None and len(rows) else {}
    out = a | {k: x.get(k) for k in SERVER_KEYS}
    if x and inst is not None:  # its flags as the report's commands give them: model paths as the user gave them
        command = howto(inst, n_ctx).server
        out["server_flags"] = spec_flags(shlex.split(command))
        if not out.get("server") and engine_figure(out)["verdict"] == SPECULATE:  # llama-server settled it
            out["server"] = command
    return out


def _predicted(r: dict, pred: pl.DataFrame, by_id: dict, n_ctx: int) -> tuple[dict, dict]:
    """A replay verdict's answer, and the timed figures of the configuration its commands run (for an adaptive
    gamma, the best fixed one: what the timed subset times)."""
    base = by_id.get(r["base"])
    group = (pl.col("base") == r["base"]) & (pl.col("category") == r["category"]) & (pl.col("draft") == r["draft"])
    gamma, adaptive, note, ran = r["gamma"], r["adaptive"], "", {}
    # llama.cpp cannot adapt: its commands (and the crosscheck) run the best fixed gamma
    if adaptive and (x := best_fixed(pred, r)) is not None:
        gamma, adaptive = x["gamma"], False
        note = (f"llama.cpp has no adaptive draft length: the commands run the best fixed gamma, {gamma} "
                f"({ci(x['speedup'], x['speedup_lo'], x['speedup_hi'], unit='x')} predicted).")
        ran = {"timed": x.get("timed_speedup"), "timed_lo": x.get("timed_speedup_lo"),
               "timed_hi": x.get("timed_speedup_hi"), "timed_prompts": x.get("timed_prompts")}
    inst = None if base is None else replace(base, draft=parse_draft(r["draft"]), gamma=gamma, adaptive=adaptive,
                                             verify=r["verify"] or "leviathan")
    same = group & (pl.col("gamma") == gamma) & (pl.col("adaptive") == adaptive) & (pl.col("verify") == "exact")
    return _answer(r, f"{r['proposer']} γ {'auto<=' if r['adaptive'] else ''}{r['gamma']}", inst,
                   "predicted from every prompt", n_ctx, pred.filter(same), note), ran


def _timed(r: dict, by_id: dict, n_ctx: int, sweep: pl.DataFrame | None) -> dict:
    """A timed verdict's answer."""
    inst = by_id.get(r.get("config"))
    twin = pl.DataFrame()
    if inst is not None and sweep is not None:  # the same configuration under llama.cpp's rule, if timed
        ids = {i.id for i in by_id.values() if replace(i, verify=inst.verify).id == inst.id and i.verify == "exact"}
        twin = sweep.filter(pl.col("config").is_in(ids) & (pl.col("category") == r["category"]))
    name = f"{r['draft_label']} γ {r['gamma_label']}" if r.get("draft") else ""
    return _answer(r, name, inst, f"timed on {r.get('prompts')} prompt(s)", n_ctx, twin)


def _answer(r: dict, name: str, inst, source: str, n_ctx: int, exact: pl.DataFrame, note: str = "") -> dict:
    a = {k: r.get(k) for k in (*VARY, "category", "policy", "verdict", "speedup", "lo", "hi", "at_most", "further",
                               "min_gain", "why", "levelled", "prompts", "accepted_len", "adjusted")} \
        | {"configuration": name, "source": source}
    how = howto(inst, n_ctx) if inst is not None and r["verdict"] == SPECULATE else None
    a |= {"server": how and how.server, "speculative_simple": how and how.speculative_simple,
          "python": how and how.python, "note": " ".join(x for x in (note, how.note) if x) if how else ""}
    x = exact.row(0, named=True) if len(exact) and how and rule_differs(inst) \
        else None
    # "instance": the instance.Instance the answer names, for every verdict (harness crosscheck runs it in
    # llama-server); not exported (answer_frame drops it)
    return a | {"exact_speedup": x and x["speedup"], "exact_lo": x and x["speedup_lo"],
                "exact_hi": x and x["speedup_hi"], "instance": inst}


def sentence(a: dict) -> str:
    """'code, greedy: speculate: ngram:3 γ 2, 1.31x [1.12, 1.52]'; 'creative, T=0.7: no gain worth having (best
    1.01x, at most 1.03x)'; with, where its plain baseline ran busy, what the prediction was levelled to."""
    line = _sentence(a)
    if a.get("levelled") == LEVEL_REPLAY and a["verdict"] in (*SETTLED, INCONCLUSIVE):
        line += "; predicted at the replay's own decode cost, as its plain baseline ran on a busy machine"
    return line


def _sentence(a: dict) -> str:
    where = f"{a['category']}, {a['policy']}"
    gain = f"{a['min_gain']:.0%}"
    v = a["verdict"]
    if v == SPECULATE:
        return (f"{where}: **speculate**: {a['configuration']}, {ci(a['speedup'], a['lo'], a['hi'], unit='x')}"
                f"{'*' * bool(a.get('adjusted'))} "
                f"(at least {a['lo']:.2f}x: a gain over {gain}; {rests_on(a)})")
    if v == NO_GAIN:
        return (f"{where}: **no gain worth having** (best {a['speedup']:.2f}x, {a['configuration']}; at most "
                f"{beside(a['at_most'], 1 + a['min_gain'])}x, under the {gain} worth having)")
    if v == PLAIN:
        return (f"{where}: **plain decoding**: every configuration loses (best {a['configuration']}, "
                f"{ci(a['speedup'], a['lo'], a['hi'], unit='x')})")
    if v == INCONCLUSIVE and a.get("check", "").startswith("predicted"):  # a contradicted prediction
        return f"{where}: **inconclusive**: {a['check']}; no timed verdict settled it"
    if v == INCONCLUSIVE:
        more = "out of reach" if a["further"] is None else \
            f"about {a['further']} more prompt{'s' * (a['further'] > 1)} would settle it"
        return (f"{where}: **inconclusive** (best {a['configuration']}, "
                f"{ci(a['speedup'], a['lo'], a['hi'], unit='x')}; {more})")
    return f"{where}: **no verdict**, {v}: {a['why']}" if a.get("why") else f"{where}: **{v}**"


def rests_on(a: dict) -> str:
    """What a verdict rests on, and its timed check: 'predicted from every prompt; timed check: confirmed: ...'."""
    check = a.get("check") or ""
    if check.startswith("predicted"):  # the prediction was contradicted and the timed run decided
        return f"{a['source']}, where {check}"
    return f"{a['source']}" + (f"; timed check: {check}" if check else "")


def section(rows: list[dict], models: dict | None = None, server: str = "",
            heading: str = "## The answer") -> list[str]:
    """The first lines of the report: the answer per group (answers), in words, each "speculate" with its
    llama-server command (how_to_run gives the others) and, where it ran there, its figures in llama-server;
    beside it, what each target's architecture (plan.json's `models`, models.arch) means for the answer. server:
    a line on the llama-server check as a whole (where it ran, or why it did not)."""
    if not rows:
        return []
    vary = [k for k in VARY if len({r[k] for r in rows}) > 1]
    lines = [heading, "",
             f"Per category and sampling policy; 95% confidence, at a least gain worth having of "
             f"{rows[0]['min_gain']:.0%} (`--min-gain`). No verdict rests on a busy measurement, nor on a prediction "
             "its own timed run contradicts. The table below gives each verdict's figures.", ""]
    said = [" ".join([f"The target {t}: {words(f)}.", *implications(f)])
            for t in dict.fromkeys(r["target"] for r in rows) if (f := (models or {}).get(t, {}).get("arch"))]
    lines += [" ".join(said), ""] if said else []
    later = sum(r.get("server_skip") == UNMEASURED for r in rows)
    if server and later:
        server += (f" {len(rows) - later} of the {len(rows)} answers ran there within the run's budget; `harness "
                   "crosscheck RUN_DIR` runs the others.")
    lines += [server, ""] if server else []
    for r in rows:
        lines.append(f"- {_where(r, vary)}{sentence(r)}")
        if said := in_server(r):
            lines.append(f"  {said}")
        lines += [f"  {x}" for x in _how(r, SERVER)]
    return lines + [""]


def in_server(a: dict) -> str:
    """The answer's configuration as llama-server ran it: its type and flags, speedup with interval, acceptance,
    outputs compared, and whether the verdict holds there (report.llamaserver's rule); or why it did not run."""
    if a.get("server_skip") == UNMEASURED:
        return ""  # counted once, in the line above the answers
    if a.get("server_skip"):
        return f"In llama-server: not measured: {a['server_skip']}."
    if a.get("server_prompts") is None:
        return ""
    acc = "nothing drafted" if a["server_acceptance"] is None else f"{a['server_acceptance']:.0%} of drafts accepted"
    same = f", {a['server_same']}/{a['server_compared']} outputs equal to plain" if a["server_compared"] else ""
    if a["server_prompts"] < MIN_INTERVAL:  # an interval of so few prompts says next to nothing
        return (f"In llama-server (`{a['server_flags']}`): {per_prompt(a.get('server_ratios'))} ({acc}{same}); too "
                "few prompts for an interval.")
    verdict = {"holds": "the verdict holds there", "contradicted": "it contradicts the verdict",
               "unsettled": "its interval neither holds nor contradicts the verdict"}.get(
        a["server_holds"], f"its interval alone says {a['server_reading']}")
    return (f"In llama-server (`{a['server_flags']}`, {a['server_prompts']} prompts): "
            f"{ci(a['server_speedup'], a['server_lo'], a['server_hi'], unit='x')}, {acc}{same}; {verdict}.")


def how_to_run(rows: list[dict]) -> list[str]:
    """The other ways to run each "speculate" of the answer: llama-speculative-simple's command (a draft model),
    llama-cpp-python's code (an n-gram lookup)."""
    vary = [k for k in VARY if len({r[k] for r in rows}) > 1]
    lines = []
    for r in rows:
        how = _how(r, OTHERS)
        if how:
            lines += [f"- {_where(r, vary)}{r['category']}, {r['policy']}: {r['configuration']}",
                      *(f"  {x}" for x in how)]
    return ["## How to run it", "", "Each \"speculate\" of the answer, with llama-server's command given there, "
            "runs in llama.cpp's own tools too:", "", *lines, ""] if lines else []


def _where(r: dict, vary: list[str]) -> str:
    where = ", ".join(f"{k} {r[k]}" for k in vary)
    return f"{where}: " if where else ""


SERVER = (("llama-server", "server", "sh"),)
OTHERS = (("llama-speculative-simple", "speculative_simple", "sh"), ("llama-cpp-python", "python", "python"))


def _how(a: dict, tools=SERVER + OTHERS) -> list[str]:
    """The commands of `tools` beside a speculate answer, as an indented block of the list item; with
    llama-server's, where llama.cpp's behaviour differs from what was measured, the note that says how."""
    if a["verdict"] != SPECULATE:
        return []
    out = []
    if a["note"] and SERVER[0] in tools:
        out.append(a["note"] + (f" Under llama.cpp's rule this run measured "
                                f"{ci(a['exact_speedup'], a['exact_lo'], a['exact_hi'], unit='x')}."
                                if a["exact_speedup"] is not None else ""))
    for label, key, lang in tools:
        if a[key]:
            out += [f"{label}:", f"```{lang}", *a[key].splitlines(), "```"]
    return out


def answer_frame(data: dict[str, pl.DataFrame], plan: dict) -> pl.DataFrame:
    """The answers as a table, for --format json/csv/parquet (answer.FMT): the bottom lines first (category
    "all"), then the answer per category."""
    return pl.DataFrame([{k: v for k, v in a.items() if k != "instance"}
                         for a in answers(data, plan, pooled=True) + answers(data, plan)], infer_schema_length=None)
