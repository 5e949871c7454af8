"""One line for what cannot be written or cannot work (errors.py): every failed write (a full disk, a file in the
way of --out) ends in one line on stderr naming the advice, through each command that writes; arguments that cannot
work are refused before anything loads. Each row is fast: refusals need no model, or load one once."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.conftest import T
from tests.helpers import ROOT, harness, one_line_error, out_files as _setup
PROMPTS = str(ROOT / "tests" / "data" / "prompts.jsonl")


# (case, argv with FILE/RUN/LIST/ZERO/OUT placeholders, words the one error line must hold)
ROWS = [
    ("calibrate --out a regular file",
     ["calibrate", T, "--k-max", "2", "--reps", "1", "--out", "FILE"],
     ["cannot write", "file", "File exists", "a file is in the way", "--out"]),
    ("calibrate --out under a regular file",
     ["calibrate", T, "--k-max", "2", "--reps", "1", "--out", "FILE/cal"],
     ["cannot write", "Not a directory", "a file is in the way", "--out"]),
    ("compare --out a regular file",
     ["compare", "RUN", "OUT", "--out", "FILE"],
     ["cannot write", "File exists", "a file is in the way", "--out"]),
    ("predict --out a regular file",
     ["predict", "RUN", "--costs", "LIST", "--out", "FILE"],
     ["cannot write", "File exists", "a file is in the way", "--out"]),
    ("run --trace on a full disk",
     ["run", T, "--prompt", "hi", "--max-tokens", "2", "--trace", "/dev/full"],
     ["cannot write /dev/full", os.strerror(errno.ENOSPC), "free some space", "--trace"]),
    ("predict --costs a JSON list",
     ["predict", "RUN", "--costs", "LIST", "--out", "OUT"],
     ["--costs", "list.json", "JSON list", "harness calibrate"]),
    ("predict --costs zero costs",
     ["predict", "RUN", "--costs", "ZERO", "--out", "OUT"],
     ["--costs", "zero.json", "positive time", "harness calibrate"]),
    ("calibrate --k-max above the batch",
     ["calibrate", T, "--k-max", "2000", "--out", "OUT"],
     ["--k-max 2000", "batch size 512", "--k-max 512 or less"]),
    ("calibrate --k-max far above the batch",
     ["calibrate", T, "--k-max", "100000", "--out", "OUT"],
     ["--k-max 100000", "batch size 512"]),
    ("bench --gamma above the batch",
     ["bench", "--target", T, "--draft", "ngram:2", "--gamma", "1000", "--prompts", PROMPTS, "--per-category", "1",
      "--max-tokens", "2", "--out", "OUT"],
     ["--gamma 1000", "1001 tokens", "batch of 512", "the largest gamma is 511"]),
    ("compare the same run twice",
     ["compare", "RUN", "RUN", "--out", "OUT"],
     ["is given twice", "compare each run once"]),
    ("compare the same run under two names",
     ["compare", "RUN", "RUN/.", "--out", "OUT"],
     ["are the same run", "compare each run once"]),
]


@pytest.mark.parametrize("case,argv,words", ROWS, ids=[r[0] for r in ROWS])
def test_one_line(tmp_path, case, argv, words):
    names = _setup(tmp_path)
    args = []
    for a in argv:
        for k, v in names.items():
            if a == k or a.startswith(k + "/"):
                a = v + a[len(k):]
        args.append(a)
    r = harness(*args)
    one_line_error(r, *words)
    assert not (tmp_path / "out").exists(), "refused, yet --out was written"


def test_os_error_line():
    """The one place a failed write becomes a line: the errno's advice, the option, the run kept."""
    from harness.errors import naming, os_error_line
    for code, advice in ((errno.ENOSPC, "free some space"), (errno.EROFS, "choose a writable --out"),
                         (errno.EACCES, "choose a writable --out"), (errno.EEXIST, "a file is in the way"),
                         (errno.ENOTDIR, "a file is in the way"), (errno.EISDIR, "a directory is in the way")):
        line = os_error_line(OSError(code, os.strerror(code), "/x/y"))
        assert line.startswith(f"cannot write /x/y: {os.strerror(code)}; {advice}"), line
    assert os_error_line(OSError(errno.ECONNRESET, "reset")) is None  # not a write's: a traceback still
    with pytest.raises(OSError) as e, naming("/r/plots/a.png", run=Path("/r")), naming(None, option="--trace"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    line = os_error_line(e.value)
    assert "cannot write /r/plots/a.png" in line and "another --trace" in line and "`harness report /r`" in line
