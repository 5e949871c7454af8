"""Traces: one JSON object per line, appended as it happens; the only input metrics are computed from."""
from __future__ import annotations

import json
from pathlib import Path


class TraceWriter:
    """Appends records to a JSONL file (flushed per record, so a kill loses at most one line);
    keep=True also holds them in memory for a caller that summarises right away."""

    def __init__(self, path: Path | None, keep: bool = False, **common):
        self.path = path
        self.common = common
        self.records: list[dict] | None = [] if keep else None
        self._f = open(path, "a", encoding="utf-8") if path else None

    def write(self, record: dict) -> None:
        rec = self.common | record
        if self.records is not None:
            self.records.append(rec)
        if self._f:
            self._f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


def read_records(path: Path) -> list[dict]:
    """Every complete line; a line cut short by a kill at the end of the file is skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
