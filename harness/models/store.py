"""What is on disk: sha256 of model files and a sidecar JSON recording verification and provenance."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def read_sidecar(path: Path) -> dict:
    try:
        return json.loads(sidecar_path(path).read_text())
    except (OSError, ValueError):
        return {}


def write_sidecar(path: Path, **info) -> dict:
    st = path.stat()
    data = read_sidecar(path) | info | {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = sidecar_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, sidecar_path(path))
    return data


def recorded_sha(path: Path) -> str | None:
    """The sha256 recorded at the last verification, if the file has not changed since."""
    info = read_sidecar(path)
    try:
        st = path.stat()
    except OSError:
        return None
    if info.get("bytes") == st.st_size and info.get("mtime_ns") == st.st_mtime_ns:
        return info.get("sha256")
    return None


def mark_verified(path: Path, sha: str, **info) -> dict:
    return write_sidecar(path, sha256=sha, verified_at=time.strftime("%Y-%m-%dT%H:%M:%S"), **info)
