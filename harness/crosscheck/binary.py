"""Which llama-server to run: the one given (--llama-server PATH), else the one `make native` built (cached under
~/.cache/harness/native/<build tag>/bin, the most recently built flavour first; HARNESS_NATIVE_BIN names such a
bin directory outright), else llama-server on PATH. A binary is taken only once its `--version` prints
llama.cpp's version line."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from harness.errors import HarnessError

NAME = "llama-server"
HOW_TO_GET = ("`make native` builds llama.cpp's own llama-server from the sources of the wheel (about 15 minutes "
              "on 2 cores, cached under ~/.cache/harness/native), or give --llama-server PATH")
VERSION_TIMEOUT_S = 30


def native_root() -> Path:
    return Path.home() / ".cache" / "harness" / "native"


def named_bin() -> Path | None:
    """HARNESS_NATIVE_BIN's llama-server (None where it is unset or empty), refused in one line where the folder it
    names does not hold one: a named folder is never passed over for another build."""
    given = os.environ.get("HARNESS_NATIVE_BIN")
    if not given:
        return None
    folder = Path(given).expanduser()
    p = folder / NAME
    if not folder.is_dir():
        what = "is a file, not the bin folder that holds it" if folder.is_file() else "does not exist"
        raise HarnessError(f"HARNESS_NATIVE_BIN={given}: the folder {what}: name the folder holding llama-server "
                           "(or unset it)")
    if not p.is_file() or not os.access(p, os.X_OK):
        raise HarnessError(f"HARNESS_NATIVE_BIN={given}: no executable {NAME} in that folder ({p}): name the "
                           "folder `make native` built it in (or unset it)")
    return p


def native_candidates() -> list[Path]:
    """`make native`'s binaries: HARNESS_NATIVE_BIN's first, then the cache's flavours, newest build first."""
    out = [p] if (p := named_bin()) else []
    built = [p for p in native_root().glob(f"*/bin/{NAME}") if p.is_file()]
    out += sorted(built, key=lambda p: p.stat().st_mtime, reverse=True)
    return out


def find(given: str | None) -> Path:
    """The llama-server to run, or one line saying how to get one."""
    if given:
        p = Path(given)
        if not p.exists() and os.sep not in given:
            found = shutil.which(given)
            p = Path(found) if found else p
        if not p.exists():
            raise HarnessError(f"--llama-server {given}: no such file (`make native` builds llama.cpp's own)")
        if p.is_dir() or not os.access(p, os.X_OK):
            raise HarnessError(f"--llama-server {given}: not an executable file")
        return p
    for p in native_candidates():
        if p.is_file() and os.access(p, os.X_OK):
            return p
    on_path = shutil.which(NAME)
    if on_path:
        return Path(on_path)
    raise HarnessError(f"no llama-server found (not built by `make native`, not on PATH): {HOW_TO_GET}")


def version(binary: Path) -> str:
    """llama.cpp's version line ("version: 1 (abcdef0)"), or one line saying the binary is not llama-server."""
    try:
        r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, errors="replace",
                           stdin=subprocess.DEVNULL, timeout=VERSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{binary} is not llama.cpp's llama-server: `--version` did not return within "
                           f"{VERSION_TIMEOUT_S} s ({HOW_TO_GET})") from None
    except OSError as e:
        raise HarnessError(f"{binary} cannot be run: {e.strerror or e} ({HOW_TO_GET})") from None
    m = re.search(r"^version: .*$", r.stdout + "\n" + r.stderr, re.M)
    if not m:
        said = (r.stdout + r.stderr).strip().splitlines()
        shown = f"it printed {said[-1][:120]!r}" if said else "it printed nothing"
        raise HarnessError(f"{binary} is not llama.cpp's llama-server: `--version` gave no version line ({shown}); "
                           f"{HOW_TO_GET}")
    return m.group(0).strip()


@functools.lru_cache(maxsize=8)
def known_flags(binary: Path) -> frozenset[str]:
    """Every flag `llama-server --help` names."""
    try:
        r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, errors="replace",
                           stdin=subprocess.DEVNULL, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"{binary} --help failed ({e}): is it llama.cpp's llama-server?") from None
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", r.stdout + r.stderr))


def lacking(args: list[str], known: frozenset[str]) -> list[str]:
    """The flags among args that the binary does not know (negative numbers are values, not flags)."""
    return [a for a in args if re.match(r"--?[A-Za-z]", a) and a not in known]


@functools.lru_cache(maxsize=8)
def devices(binary: Path) -> tuple[str, ...]:
    """The GPU (non-CPU) devices `llama-server --list-devices` names: none where its build has no offload."""
    try:
        r = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, errors="replace",
                           stdin=subprocess.DEVNULL, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"{binary} --list-devices failed ({e}): is it llama.cpp's llama-server?") from None
    return tuple(re.findall(r"^\s+(\S+): ", r.stdout, re.M))
