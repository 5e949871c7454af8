"""`harness predict`: a run's replayed acceptance with another machine's calibrated costs. On one box, threads 1
stands in for the other machine: acceptance replayed at 2 threads, costs calibrated at 1, a timed run at 1 to check
against; and every mismatched input refused in one line."""
import json

import pytest

from tests.conftest import CATEGORIES, D, POLICIES, T
from tests.helpers import calibration as _calibration, harness, md_table, one_line_error, out_files as _setup



@pytest.fixture(scope="module")
def machine(tmp_path_factory, replay_run, calibrations, timed_run_t1):
    """The replay at 2 threads, both models calibrated at 1 thread, the same sweep timed at 1 thread."""
    return tmp_path_factory.mktemp("predict"), replay_run, calibrations[0], timed_run_t1


@pytest.mark.slow  # the threads-1 sweep and calibrations: 2 min of the fast tier
def test_calibrations_carry_their_machine(machine):
    _, _, cals, _ = machine
    c = json.loads(cals[0].read_text())
    assert c["threads"] == 1 and c["machine"]["cpu"] and c["machine"]["host"] and len(c["sha256"]) == 64
    assert c["taken"] > 1.7e9  # when: `predict --against` says how far from the timed run
    assert "shares" in c["noise"]  # what the machine did meanwhile: a busy calibration gives no verdict


@pytest.mark.slow  # the threads-1 sweep and calibrations: 2 min of the fast tier
def test_predicted_verdicts_for_the_calibrated_machine_beside_its_timed_run(machine):
    out, run, cals, timed = machine
    r = harness("predict", str(run), "--costs", str(cals[0]), "--costs", str(cals[1]), "--against", str(timed),
                "--out", str(out / "pred"))
    assert r.returncode == 0, r.stderr
    md = (out / "pred" / r.stdout.strip().rsplit("/", 1)[1]).read_text()
    assert "1 threads" in md and run.name in md
    verdicts = md_table(md, "# Predicted for")
    assert {(v["category"], v["policy"]) for v in verdicts} == {(c, p) for c in CATEGORIES for p in POLICIES}
    assert all(v["timed there"] for v in verdicts)
    rows = md_table(md, "## Predicted against timed")
    assert {(x["proposer"], x["gamma"]) for x in rows} == {(D, "2"), ("ngram:2", "2")}  # what was timed there
    assert all(x["acceptance"].endswith("%") and x["(timed)"].endswith("%") for x in rows)
    assert "The calibrations were taken" in md
    assert (out / "pred" / r.stdout.strip().rsplit("/", 1)[1].replace(".md", ".csv")).exists()


def test_the_replays_costs_are_swapped_for_the_calibrated_ones():
    from harness.compare.predict import swapped_costs
    cal = {"contexts": [128, 1024], "k": [1, 2, 3], "ms_by_context": [[10, 12, 14], [11, 13, 15]],
           "ms_last_by_context": [[2, 3, 4], [2.5, 3.5, 4.5]]}
    recs = [{"type": "replay", "x": 1},
            {"type": "costs", "config": "b", "proposer": D, "contexts": [100], "target_ms_by_context": [[1, 2]],
             "draft_ms_by_context": [[0.1, 0.2]], "overhead_ms": 0.3},
            {"type": "costs", "config": "b", "proposer": "ngram:2", "contexts": [100],
             "target_ms_by_context": [[1, 2]], "draft_ms_by_context": [[0.01, 0.01]], "overhead_ms": 0.3}]
    got = swapped_costs(recs, {T: cal, D: cal}, {"b": T}, gamma_max=1)
    assert got[0] == recs[0]
    assert got[1]["target_ms_by_context"] == [[10, 12], [11, 13]] and got[1]["contexts"] == [128, 1024]
    assert got[1]["draft_ms_by_context"] == [[2, 3], [2.5, 3.5]] and got[1]["overhead_ms"] == 0.3
    assert got[2]["draft_ms_by_context"] == [[0.01, 0.01]]  # a lookup's time is the harness's own


def test_against_timed_counts_the_greedy_rows_that_took_the_same_steps():
    import polars as pl

    from harness.compare.predict import render
    row = {"target": T, "category": "code", "adaptive": False, "speedup_lo": 0.8, "speedup_hi": 1.2,
           "timed_speedup_lo": 0.8, "timed_speedup_hi": 1.2}
    same = pl.DataFrame([row | {"policy": "greedy", "proposer": "ngram:2", "gamma": 1, "acceptance_rate": 0.5,
                                "timed_acceptance_rate": 0.5, "speedup": 1.0, "timed_speedup": 1.05},
                         row | {"policy": "greedy", "proposer": D, "gamma": 1, "acceptance_rate": 0.5,
                                "timed_acceptance_rate": 0.6, "speedup": 1.0, "timed_speedup": 1.3},
                         row | {"policy": "T=0.7", "proposer": D, "gamma": 1, "acceptance_rate": 0.4,
                                "timed_acceptance_rate": 0.5, "speedup": 1.0, "timed_speedup": 1.02}])
    machine = {"host": "h", "cpu": "c", "threads": 1, "ngl": 0, "date": "d", "llama-cpp-python": "0.3.36"}
    md = render("run", same, pl.DataFrame(), machine, "timed")
    assert "2 of 3 rows within 10%" in md
    assert "acceptances agree, 1 of 2 greedy rows, 1 of them within 10%" in md  # the sampled row is a draw
    got = {(x["proposer"], x["policy"]): (x["acceptance"], x["(timed)"]) for x in md_table(md, "## Predicted against")}
    assert got[(D, "greedy")] == ("50%", "60%") and got[("ngram:2", "greedy")] == ("50%", "50%")


def test_a_replay_of_two_targets_meets_the_timed_rows_of_its_own_target():
    """`make bench` replays a Q4 and an F16 target through the same draft: a run timed on one of them is set
    beside that target's predictions only, and each target's verdicts stand under its name."""
    import polars as pl

    from harness.compare.predict import beside, render
    key = {"category": "code", "policy": "greedy", "proposer": D, "gamma": 1, "adaptive": False}
    pred = pl.DataFrame([key | {"target": t, "speedup": s, "speedup_lo": s - 0.1, "speedup_hi": s + 0.1,
                                "acceptance_rate": 0.5} for t, s in ((T, 0.8), ("f16", 1.3))])
    timed = pl.DataFrame([key | {"target": T, "timed_speedup": 0.82, "timed_speedup_lo": 0.7, "timed_speedup_hi": 0.9,
                                 "timed_acceptance_rate": 0.5}])
    same = beside(pred, timed, "inner")
    assert same["target"].to_list() == [T] and same["speedup"].to_list() == [0.8]
    assert beside(pred, timed, "left").filter(pl.col("target") == "f16")["timed_speedup"].to_list() == [None]
    verdicts = pl.DataFrame([{"target": t, "category": "code", "policy": "greedy", "proposer": D, "gamma": 1,
                              "speedup": 1.0, "lo": 0.9, "hi": 1.1, "adjusted": False, "verdict": "inconclusive",
                              "prompts": 10} for t in (T, "f16")])
    machine = {"host": "h", "cpu": "c", "threads": 1, "ngl": 0, "date": "d", "llama-cpp-python": "0.3.36"}
    md = render("run", same, verdicts, machine, None)
    assert f"Target `{T}`:" in md and "Target `f16`:" in md  # each target's verdicts under its name
    assert "1 of 1 rows within 10%" in md


def test_the_report_says_how_far_from_the_timed_run_the_calibrations_were_taken():
    from harness.compare.predict import apart, taken_at
    plan = {"started": 1_000_000.0, "took_s": {"total": 1800.0},
            "instances": [{"target": "t", "draft": "none"}, {"target": "t", "draft": "d"}]}
    old = {"machine": {"date": "1970-01-12 13:46:40 UTC"}}  # 1,000,000 s: recorded before calibrations kept "taken"
    assert taken_at(old) == 1_000_000.0 and taken_at({"machine": {"date": "1970-01-12 13:46:40 CET"}}) is None
    said = " The calibrations were taken"
    assert apart({"t": old, "d": {"taken": 1_000_900.0}}, plan) == f"{said} while the timed run ran."
    assert apart({"t": {"taken": 1_001_800.0 + 360}}, plan) == f"{said} up to 6 min after it ended."
    far = apart({"t": {"taken": 1_000_000.0 - 7200}, "d": {"taken": 1_000_000.0 - 60}}, plan)
    assert far.startswith(f"{said} up to 2.0 h before it began: a machine's pace can move")
    assert apart({"t": {"machine": {"date": "?"}}}, plan) == ""  # no moment known: nothing said
    # a model the timed run did not use (make bench's F16 target, say) is not counted
    assert apart({"t": {"taken": 1_001_800.0 + 360}, "f16": {"taken": 1_000_000.0 - 7200}}, plan) == \
        f"{said} up to 6 min after it ended."


def _edited(src, dest, change):
    c = json.loads(src.read_text())
    change(c)
    dest.write_text(json.dumps(c))
    return str(dest)


@pytest.mark.slow  # the threads-1 sweep and calibrations: 2 min of the fast tier
def test_mismatched_inputs_are_refused(machine, tmp_path):
    out, run, cals, timed = machine
    t, d = map(str, cals)
    one_line_error(harness("predict", str(run), "--costs", t), "no calibration of", D)
    one_line_error(harness("predict", str(timed), "--costs", t, "--costs", d), "has no replay")
    other = _edited(cals[1], tmp_path / "g.json", lambda c: c.update(model="gemma-3-270m-q4_k_m"))
    one_line_error(harness("predict", str(run), "--costs", t, "--costs", d, "--costs", other), "did not use")
    old = _edited(cals[1], tmp_path / "old.json", lambda c: c.pop("machine"))
    one_line_error(harness("predict", str(run), "--costs", t, "--costs", old), "calibrate", "again")
    far = _edited(cals[1], tmp_path / "far.json", lambda c: c["machine"].update(host="elsewhere"))
    one_line_error(harness("predict", str(run), "--costs", t, "--costs", far), "one machine")
    sha = _edited(cals[1], tmp_path / "sha.json", lambda c: c.update(sha256="0" * 64))
    one_line_error(harness("predict", str(run), "--costs", t, "--costs", sha), "another file")
    short = _edited(cals[1], tmp_path / "short.json", lambda c: c.update(
        k=[1, 2], **{key: [m[:2] for m in c[key]] for key in ("ms_by_context", "ms_last_by_context",
                                                               "ms_sd_by_context", "ms_last_sd_by_context")}))
    one_line_error(harness("predict", str(run), "--costs", t, "--costs", short), "--k-max 4")
    one_line_error(harness("predict", str(run), "--costs", t, "--costs", d, "--against", str(run)), "timed at")


# (what replaces fields of a good calibration, the words of the one line naming its file): refused where the file
# is read, before any run is opened or any cost computed (issue 43)
BAD_CALIBRATIONS = {
    "contexts-empty": ({"contexts": [], "ms_by_context": [], "ms_last_by_context": []}, ["contexts list is empty"]),
    "contexts-not-a-list": ({"contexts": 128}, ["contexts list is 128"]),
    "contexts-and-rows-differ": ({"contexts": [128]}, ["not one positive time per k and context", "1 context(s)"]),
    "contexts-decreasing": ({"contexts": [1024, 128]}, ["contexts [1024, 128]", "increasing"]),
    "contexts-strings": ({"contexts": ["128", "1024"]}, ["contexts ['128', '1024']", "increasing"]),
    "k-not-from-one": ({"k": [2, 3, 4]}, ["k [2, 3, 4] is not 1..N"]),
    "cost-not-finite": ({"ms_by_context": [[5.0, float("nan"), 7.0], [6.0, 7.0, 8.0]]}, ["positive time"]),
    "spread-misshapen": ({"ms_sd_by_context": [[0.1]]}, ["ms_sd_by_context", "one spread"]),
    "threads-a-string": ({"threads": "1"}, ["its threads is '1'"]),
    "machine-not-an-object": ({"machine": "vm"}, ["machine record lacks its fields"]),
    "machine-without-host": ({"machine": {"cpu": "c", "date": "d", "llama-cpp-python": "0"}},
                             ["machine record lacks host"]),
}


@pytest.mark.parametrize("change, words", list(BAD_CALIBRATIONS.values()), ids=list(BAD_CALIBRATIONS))
def test_a_calibration_that_cannot_price_a_step_is_refused_naming_its_file(change, words, tmp_path):
    from tests.helpers import calibration as _calibration
    (tmp_path / "run").mkdir()
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(_calibration(**change)))
    r = harness("predict", tmp_path / "run", "--costs", cal, "--out", tmp_path / "out")
    one_line_error(r, f"--costs {cal}:", *words, "harness calibrate")
    assert not (tmp_path / "out").exists()


def test_home_in_predicts_paths_is_expanded(tmp_path):
    """'~/cal.json' is the home folder's file: refused for what it holds, not as a file named ~/cal.json here."""
    from tests.helpers import calibration as _calibration
    (tmp_path / "run").mkdir()
    (tmp_path / "cal.json").write_text(json.dumps(_calibration(contexts=[])))
    r = harness("predict", "~/run", "--costs", "~/cal.json", "--out", "~/out", cwd=tmp_path / "run",
                env={"HOME": str(tmp_path)})
    one_line_error(r, f"--costs {tmp_path / 'cal.json'}:", "contexts list is empty")


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_a_calibration_taken_on_a_busy_machine_gives_no_verdict(tmp_path):
    """The calibrations of a committed replayed run, one marked as `harness calibrate` marks what it measured while
    another process used the CPU: every group of that target has no verdict, the reason on its line."""
    from pathlib import Path
    run = Path("reports/runs/20261204-015938-vm")
    cals = sorted(Path("reports/calibration-t1-amd").glob("*.json"))
    busy = tmp_path / cals[0].name  # the 0.5B draft's: every row that drafts with it
    busy.write_text(json.dumps(json.loads(cals[0].read_text()) | {
        "noise": {"shares": [0.4] * 12, "threshold": 0.05, "own_shares": [], "asked": None, "load1": 1.0}}))
    r = harness("predict", run, "--costs", busy, *[a for c in cals[1:] for a in ("--costs", c)], "--out",
                tmp_path / "out")
    assert r.returncode == 0, r.stderr
    rows = md_table(Path(r.stdout.strip()).read_text(), "# Predicted for")
    assert rows and all(x["verdict"] == "unreliable (busy machine)" for x in rows)


def test_zero_costs_never_divide(tmp_path):
    """The zero-cost calibration is refused as such, not by a ZeroDivisionError further on."""
    from harness.compare.predict import load_calibrations
    from harness.errors import HarnessError
    names = _setup(tmp_path)
    with pytest.raises(HarnessError, match="positive time"):
        load_calibrations([names["ZERO"]])
    half = _calibration(ms_last_by_context=[[4.0, 0, 5.0], [5.0, 5.5, 6.0]])
    (tmp_path / "half.json").write_text(json.dumps(half))
    with pytest.raises(HarnessError, match="positive time"):
        load_calibrations([str(tmp_path / "half.json")])
    (tmp_path / "ok.json").write_text(json.dumps(_calibration()))
    assert load_calibrations([str(tmp_path / "ok.json")])[0][T]["k"] == [1, 2, 3]


def test_a_server_run_is_not_told_to_replay_under_the_server(tmp_path, monkeypatch):  # issue 57, case 181
    from harness.compare import predict as predict_mod
    from harness.errors import HarnessError
    monkeypatch.setattr(predict_mod, "load_calibrations", lambda paths: ({}, {}))
    (tmp_path / "plan.json").write_text(json.dumps({"schema": 2, "params": {"engine": "server"}, "instances": [],
                                                    "prompt_ids": [], "categories": []}))
    with pytest.raises(HarnessError, match="which --engine server does not take: bench the same configurations "
                                           "with --engine harness --replay"):
        predict_mod.predict(tmp_path, [])
