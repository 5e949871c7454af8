"""JSONL records: a half-written line left by a kill never swallows the next record, and is repaired away; a line
damaged after it was written is refused in one line that names the file and the line; a gzipped trace reads as a
plain one."""
import gzip
import json
import os

import pytest

from harness.errors import HarnessError
from harness.trace import append_record, compress, decompress, gzipped, read_records, repair


def test_a_partial_last_line_does_not_swallow_the_next_record(tmp_path):
    f = tmp_path / "results.jsonl"
    f.write_text('{"config": "a", "status": "ok"}\n{"config": "b", "sta')  # killed mid-write
    append_record(f, {"config": "c", "status": "ok"})
    assert [r["config"] for r in read_records(f, cut_rows=True)] == ["a", "c"]


def test_repair_cuts_only_a_partial_last_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"x": 1}\n{"x": 2')
    assert repair(f) is True
    assert f.read_text() == '{"x": 1}\n'
    assert repair(f) is False and f.read_text() == '{"x": 1}\n'
    f.write_text('{"x": 1')
    assert repair(f) is True and f.read_text() == ""
    assert repair(tmp_path / "missing.jsonl") is False


# (case, the file's name, its bytes, words of the one error line; None: read, the cut last line skipped)
READ_ROWS = [
    ("a line cut short at the end", "u.jsonl", b'{"i": 1}\n{"i": 2}\n{"i": 3', None),
    ("a damaged line mid-file", "u.jsonl", b'{"i": 1}\n{"i": 2, "acc\n{"i": 3}\n', ["u.jsonl line 2 is damaged",
                                                                                    "not JSON", "restore"]),
    ("a damaged last line ended by a newline", "u.jsonl", b'{"i": 1}\n{"i": 2\n', ["line 2 is damaged"]),
    ("invalid UTF-8", "u.jsonl", b'{"i": 1}\n{"i": "\xff\xfe"}\n{"i": 3}\n', ["line 2 is damaged (not UTF-8)"]),
    ("a JSON list", "u.jsonl", b'{"i": 1}\n[1, 2]\n', ["line 2 is a JSON list, not a record"]),
    ("null", "u.jsonl", b'null\n{"i": 1}\n', ["line 1 is null, not a record"]),
    ("gzipped twice", "u.jsonl.gz", gzip.compress(gzip.compress(b'{"i": 1}\n', mtime=0), mtime=0),
     ["u.jsonl.gz is gzipped twice", "gzip -dc"]),
    ("gzipped, named plain", "u.jsonl", gzip.compress(b'{"i": 1}\n', mtime=0),
     ["u.jsonl is gzipped but named as a plain trace", "rename it to u.jsonl.gz"]),
    ("cut short gzip", "u.jsonl.gz", gzip.compress(b'{"i": 1}\n' * 100, mtime=0)[:-20],
     ["u.jsonl.gz is damaged", "does not decompress"]),
]


@pytest.mark.parametrize("case, name, data, words", READ_ROWS, ids=[r[0] for r in READ_ROWS])
def test_a_trace_damaged_after_it_was_written_is_one_line_naming_file_and_line(tmp_path, case, name, data, words):
    f = tmp_path / name
    f.write_bytes(data)
    if words is None:
        assert read_records(f) == [{"i": 1}, {"i": 2}]
        return
    with pytest.raises(HarnessError) as e:
        read_records(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_rows_cut_short_anywhere_are_skipped_where_appends_follow_a_kill(tmp_path):
    """results.jsonl and noise.jsonl: append_record ends a half line a kill left, so one can sit mid-file."""
    f = tmp_path / "results.jsonl"
    f.write_bytes(b'{"i": 1}\n{"i": \n{"i": 2}\n')
    assert read_records(f, cut_rows=True) == [{"i": 1}, {"i": 2}]
    with pytest.raises(HarnessError, match="line 2 is damaged"):
        read_records(f)


def test_repair_only_reads_an_intact_file(tmp_path, monkeypatch):
    """A read-only run is reported: nothing is opened for writing unless a line was cut."""
    import harness.trace as trace_mod
    f = tmp_path / "r.jsonl"
    f.write_text('{"x": 1}\n')
    monkeypatch.setattr(trace_mod.os, "truncate", lambda *a: pytest.fail("truncated an intact file"))
    modes = []
    monkeypatch.setattr(trace_mod, "open", lambda p, mode="r", *a, **k: modes.append(mode) or open(p, mode, *a, **k),
                        raising=False)
    assert repair(f) is False and modes == ["rb"]


# -- gzipped traces
def test_read_records_takes_plain_and_gzipped_alike(tmp_path):
    f = tmp_path / "u.jsonl"
    recs = [{"type": "step", "i": i, "text": "é"} for i in range(50)]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"type": "st')  # a kill mid-line
    assert read_records(f) == recs
    raw = f.read_bytes()
    gz = compress(f)
    assert gz == gzipped(f) == tmp_path / "u.jsonl.gz" and not f.exists()
    assert gzip.decompress(gz.read_bytes()) == raw
    assert read_records(gz) == recs
    assert gz.read_bytes()[4:8] == b"\0\0\0\0"  # no time stamp: the same trace gives the same bytes
    first = gz.read_bytes()
    assert decompress(gz) == f and f.read_bytes() == raw and not gz.exists()
    assert compress(f).read_bytes() == first


def test_a_damaged_gzipped_trace_is_one_clear_error(tmp_path):
    f = tmp_path / "u.jsonl.gz"
    f.write_bytes(gzip.compress(b'{"a": 1}\n' * 100, mtime=0)[:-20])  # cut short
    with pytest.raises(HarnessError, match="damaged"):
        read_records(f)


def test_a_full_disk_on_an_appended_row_names_the_file(tmp_path, monkeypatch):  # issue 57, case 158
    import builtins
    import errno

    from harness.errors import os_error_line
    from harness.trace import append_record

    class Full:
        def __init__(self, *a, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def tell(self):
            return 0

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(builtins, "open", Full)
    with pytest.raises(OSError) as e:
        append_record(tmp_path / "results.jsonl", {"a": 1})
    monkeypatch.undo()
    assert os_error_line(e.value).startswith(f"cannot write {tmp_path / 'results.jsonl'}: No space left on device; "
                                             "free some space")
