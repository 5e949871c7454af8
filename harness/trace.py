"""Traces: one JSON object per line, appended as it happens; the only input metrics are computed from. A finished
run's traces may be gzipped (`harness archive`): x.jsonl becomes x.jsonl.gz, and every reader takes either."""
from __future__ import annotations

import gzip
import json
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
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)


def repair(path: Path) -> bool:
    """Cut a partial last line (a kill in the middle of a write) off a JSONL file; True if there was one."""
    if not path.exists():
        return False
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        if size == 0:
            return False
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return False
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1
        f.truncate(keep)
    return True


GZ = ".gz"


def gzipped(path: Path) -> Path:
    """Where the trace `path` is once compressed: x.jsonl -> x.jsonl.gz."""
    return path.with_name(path.name + GZ)


def discard(path: Path) -> None:
    """Remove a trace in either form (a rerun starts its trace afresh)."""
    path.unlink(missing_ok=True)
    gzipped(path).unlink(missing_ok=True)


def read_records(path: Path) -> list[dict]:
    """Every complete line of a JSONL file, plain or gzipped (by its name); a line cut short by a kill at the end
    of the file is skipped."""
    out = []
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(GZ)
              else open(path, encoding="utf-8")) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise HarnessError(f"{path} is damaged ({e}): it does not decompress; restore it from git") from None
    return out


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
