"""Traces: one JSON object per line, appended as it happens; the only input metrics are computed from. A finished
run's traces may be gzipped (`harness archive`): x.jsonl becomes x.jsonl.gz, and every reader takes either."""
from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path

from harness.errors import HarnessError, naming


class TraceWriter:
    """Appends records to a JSONL file (flushed per record, so a kill loses at most one line);
    keep=True also holds them in memory for a caller that summarises right away."""

    def __init__(self, path: Path | None, keep: bool = False, **common):
        self.path = path
        self.common = common
        self.records: list[dict] | None = [] if keep else None
        self._f = None
        if path:
            try:
                self._f = open(path, "a", encoding="utf-8")
            except OSError as e:
                raise HarnessError(f"cannot write the trace file {path}: {e.strerror}") from None

    def write(self, record: dict) -> None:
        rec = self.common | record
        if self.records is not None:
            self.records.append(rec)
        if self._f:
            with naming(self.path):  # a full disk (ENOSPC) on the write names the trace file
                self._f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                self._f.flush()

    def close(self) -> None:
        if self._f:
            f, self._f = self._f, None
            with naming(self.path):
                f.close()


def append_record(path: Path, record: dict) -> None:
    """Append one JSON line, first ending a line a killed writer left half-written, so that it cannot swallow
    this one (the half line stays unreadable and is skipped; `repair` drops it)."""
    data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
    with naming(path), open(path, "a+b") as f:  # a full disk on the write (or the close) names the file
        if f.tell() > 0:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)


def repair(path: Path) -> bool:
    """Cut a partial last line (a kill in the middle of a write) off a JSONL file; True if there was one. An intact
    file is only read: a read-only run is reported without a write."""
    if not path.exists():
        return False
    with open(path, "rb") as f:
        data = f.read()
    if not data or data.endswith(b"\n"):
        return False
    os.truncate(path, data.rfind(b"\n") + 1)
    return True


GZ = ".gz"


def gzipped(path: Path) -> Path:
    """Where the trace `path` is once compressed: x.jsonl -> x.jsonl.gz."""
    return path.with_name(path.name + GZ)


def discard(path: Path) -> None:
    """Remove a trace in either form (a rerun starts its trace afresh)."""
    path.unlink(missing_ok=True)
    gzipped(path).unlink(missing_ok=True)


GZIP_MAGIC = b"\x1f\x8b"
# what to do about a damaged trace line: a trace is only ever appended to by its unit's worker
TRACE_FIX = ("restore the file (from git or a copy), or delete it and resume the run (`harness bench --resume "
             "RUN_DIR`) to measure its unit again")


def lines(path: Path) -> list[bytes]:
    """A JSONL file's lines, plain or gzipped (by its name), as bytes: the last one is b"" unless a kill cut the
    file short in the middle of a line."""
    gz = path.name.endswith(GZ)
    try:
        data = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise HarnessError(f"{path} is damaged ({e}): it does not decompress; restore it from git") from None
    if data.startswith(GZIP_MAGIC):
        raise HarnessError(f"{path} is gzipped twice: take one layer off (`gzip -dc F > F.tmp && mv F.tmp F`, F "
                           "being that file)" if gz else
                           f"{path} is gzipped but named as a plain trace: rename it to {gzipped(path).name}")
    return data.split(b"\n")


def parse(line: bytes):
    """One line's JSON value; ValueError if it is not JSON in UTF-8."""
    return json.loads(line.decode("utf-8"))


def kind(value) -> str:
    """What a JSON value that is not a record is, in words."""
    return {list: "a JSON list", str: "a JSON string", bool: "a JSON boolean", type(None): "null"}.get(
        type(value), "a JSON number")


def read_numbered(path: Path, cut_rows: bool = False, fix: str = TRACE_FIX) -> list[tuple[int, dict]]:
    """Every record of a JSONL file with its line number. A line cut short by a kill at the end of the file is
    skipped; so is one anywhere with cut_rows (results.jsonl and noise.jsonl: append_record ends a line a killed
    writer left, and appends after it). Any other line that is not a JSON record was damaged after it was
    written: one line naming it, with `fix`, what to do."""
    out = []
    split = lines(path)
    for n, line in enumerate(split, 1):
        if not line.strip():
            continue
        try:
            rec = parse(line)
        except ValueError as e:
            if cut_rows or n == len(split):
                continue
            why = "not UTF-8" if isinstance(e, UnicodeDecodeError) else "not JSON"
            raise HarnessError(f"{path} line {n} is damaged ({why}): {fix}") from None
        if not isinstance(rec, dict):
            raise HarnessError(f"{path} line {n} is {kind(rec)}, not a record: {fix}")
        out.append((n, rec))
    return out


def read_records(path: Path, cut_rows: bool = False) -> list[dict]:
    """Every record of a JSONL file, plain or gzipped (read_numbered)."""
    return [r for _, r in read_numbered(path, cut_rows)]


def compress(path: Path) -> Path:
    """Gzip a finished trace beside itself, reproducibly (no time stamp, no name in the header: the same trace
    gives the same bytes), and remove the plain file once the gzipped one reads back byte for byte."""
    data = path.read_bytes()
    out = gzipped(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    if gzip.decompress(tmp.read_bytes()) != data:
        tmp.unlink()
        raise HarnessError(f"gzipping {path} did not read back the same bytes; the plain trace is kept")
    tmp.replace(out)
    path.unlink()
    return out


def decompress(path: Path) -> Path:
    """The reverse of compress: x.jsonl.gz back to x.jsonl."""
    out = path.with_name(path.name.removesuffix(GZ))
    out.write_bytes(gzip.decompress(path.read_bytes()))
    path.unlink()
    return out
