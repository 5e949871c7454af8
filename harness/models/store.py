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


def current_sha(path: Path) -> str:
    """The file's sha256: the sidecar's while its size and mtime are those it recorded (cheap), else hashed."""
    return recorded_sha(path) or sha256_file(path)


def changed_since_verified(path: Path) -> str | None:
    """The sha256 the sidecar verified, when the file no longer has it; None while it does (or when nothing was
    verified). Only a file whose size or mtime moved is hashed again; one that still matches has its sidecar
    brought up to date (a copy or a touch), so the next look is cheap again."""
    info = read_sidecar(path)
    want = info.get("sha256")
    if not want or "bytes" not in info or "mtime_ns" not in info or recorded_sha(path) == want:
        return None
    if sha256_file(path) != want:
        return want
    try:
        write_sidecar(path)
    except OSError:
        pass  # a read-only models directory: the next look hashes again
    return None


def mark_verified(path: Path, sha: str, **info) -> dict:
    return write_sidecar(path, sha256=sha, verified_at=time.strftime("%Y-%m-%dT%H:%M:%S"), **info)
