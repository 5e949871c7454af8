"""models.toml: the catalog of GGUF files, and resolving a name or path to one."""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError

GGUF_MAGIC = b"GGUF"
SOURCE_KINDS = ("pypi", "path", "hf")


def _env_path(var: str, default: str) -> Path:
    """A path from the environment, ~ expanded; set but empty it is refused (it would mean the current folder)."""
    v = os.environ.get(var)
    if v is not None and not v.strip():
        raise HarnessError(f"{var} is set but empty: give it a path, or unset it for the default ({default})")
    return Path(v or default).expanduser()


def models_dir() -> Path:
    return _env_path("HARNESS_MODELS_DIR", "models")


def catalog_path() -> Path:
    return _env_path("HARNESS_CATALOG", "models.toml")


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str


@dataclass(frozen=True)
class Model:
    name: str
    kind: str  # pypi | path | hf | derived | file (an ad-hoc path given on the command line)
    family: str = ""
    role: str = ""
    quant: str = ""
    bytes: int | None = None
    sha256: str | None = None
    parts: tuple[Part, ...] = ()
    source_path: Path | None = None
    hf_repo: str = ""
    hf_file: str = ""
    derive_from: str = ""
    derive_ftype: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def path(self) -> Path:
        if self.source_path is not None:
            return self.source_path
        return models_dir() / f"{self.name}.gguf"

    @property
    def requantized(self) -> bool:
        return self.kind == "derived"


def _bad(name: str, key: str, why: str) -> HarnessError:
    return HarnessError(f"{catalog_path()}: entry '{name}': key '{key}' {why}")


def _expand_parts(name: str, src: dict) -> tuple[Part, ...]:
    for key in ("package", "version", "member"):
        if not isinstance(src.get(key), str) or not src[key]:
            raise _bad(name, f"source.{key}", "must be a non-empty string")
    count = src.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise _bad(name, "source.count", "must be a positive integer")
    try:
        return tuple(
            Part(src["package"].format(n=n, i=n - 1), src["version"], src["member"].format(n=n, i=n - 1))
            for n in range(1, count + 1)
        )
    except (KeyError, ValueError, IndexError) as e:
        raise _bad(name, "source", f"has a bad {{n}}/{{i}} template ({e})") from None


def _parse_entry(name: str, e: dict, base_dir: Path) -> Model:
    if not isinstance(e, dict):
        raise HarnessError(f"{catalog_path()}: entry '{name}' must be a table")
    common = {k: e.get(k, "") for k in ("family", "role", "quant")}
    for k, v in common.items():
        if not isinstance(v, str):
            raise _bad(name, k, "must be a string")
    size = e.get("bytes")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise _bad(name, "bytes", "must be a positive integer")
    sha = e.get("sha256")
    if sha is not None and (not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise _bad(name, "sha256", "must be 64 lowercase hex characters")
    if "derive" in e:
        d = e["derive"]
        if not isinstance(d, dict) or not isinstance(d.get("from"), str) or not isinstance(d.get("ftype"), str):
            raise _bad(name, "derive", "must be { from = NAME, ftype = QUANT }")
        common["quant"] = d["ftype"].upper()
        return Model(name, "derived", derive_from=d["from"], derive_ftype=d["ftype"].upper(),
                     bytes=size, sha256=sha, **{k: common[k] for k in ("family", "role", "quant")})
    src = e.get("source")
    if not isinstance(src, dict):
        raise _bad(name, "source", "is missing (or give derive = { from, ftype })")
    kind = src.get("kind")
    if kind not in SOURCE_KINDS:
        raise _bad(name, "source.kind", f"must be one of {', '.join(SOURCE_KINDS)}, not {kind!r}")
    if kind == "pypi":
        if size is None or sha is None:
            raise _bad(name, "sha256" if size else "bytes", "is required for a pypi source")
        return Model(name, kind, bytes=size, sha256=sha, parts=_expand_parts(name, src), **common)
    if kind == "path":
        if not isinstance(src.get("path"), str):
            raise _bad(name, "source.path", "must be a string")
        p = Path(os.path.expanduser(src["path"]))
        return Model(name, kind, bytes=size, sha256=sha, source_path=p if p.is_absolute() else base_dir / p,
                     **common)
    for key in ("repo", "file"):
        if not isinstance(src.get(key), str):
            raise _bad(name, f"source.{key}", "must be a string")
    return Model(name, kind, bytes=size, sha256=sha, hf_repo=src["repo"], hf_file=src["file"], **common)


def load_catalog(path: Path | None = None) -> dict[str, Model]:
    named = path is None and os.environ.get("HARNESS_CATALOG")
    path = path or catalog_path()
    if not path.exists():
        raise HarnessError(f"model catalog {path} not found: run from the project root or set HARNESS_CATALOG")
    if path.is_dir():
        what = f"HARNESS_CATALOG={named} names" if named else f"the model catalog {path} is"
        raise HarnessError(f"{what} a folder, not a catalog file: point HARNESS_CATALOG at a models.toml file (or "
                           "run from the project root without it)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise HarnessError(f"{path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise HarnessError(f"model catalog {path} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise HarnessError(f"cannot read the model catalog {path}: {e.strerror or e}") from None
    entries = data.get("models")
    if not isinstance(entries, dict) or not entries:
        raise HarnessError(f"{path}: no [models.NAME] entries")
    cat = {name: _parse_entry(name, e, path.parent) for name, e in entries.items()}
    for m in cat.values():
        if m.kind == "derived" and m.derive_from not in cat:
            raise _bad(m.name, "derive.from", f"names '{m.derive_from}', which is not in the catalog")
    for m in cat.values():  # a cycle would make fetch recurse forever
        chain = [m.name]
        while cat[chain[-1]].kind == "derived":
            chain.append(cat[chain[-1]].derive_from)
            if chain[-1] in chain[:-1]:
                raise _bad(m.name, "derive.from", f"forms a cycle: {' -> '.join(chain)}")
    return cat


def check_gguf_file(path: Path) -> None:
    if not path.exists():
        raise HarnessError(f"model file {path} does not exist")
    if not path.is_file():
        raise HarnessError(f"model path {path} is not a file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:  # a read's failure, not a write's (os_error_line would say --out)
        raise HarnessError(f"cannot read model file {path}: {e.strerror or e}; check its permissions") from None
    if magic != GGUF_MAGIC:
        raise HarnessError(f"{path} is not a GGUF file (magic bytes {magic!r}, expected b'GGUF')")


def resolve(ref: str, catalog: dict[str, Model] | None = None) -> Model:
    """A catalog name or a path to a .gguf file (a path needs no catalog; ~ is expanded)."""
    if not ref.strip():
        raise HarnessError("an empty model name: give a catalog name (see `harness models list`) or the path of a "
                           ".gguf file")
    p = Path(ref).expanduser()
    if catalog is None and p.is_file():
        check_gguf_file(p)
        return Model(p.stem, "file", source_path=p)
    cat = catalog if catalog is not None else load_catalog()
    if ref in cat:
        return cat[ref]
    if p.exists() or ref.endswith(".gguf") or os.sep in ref:
        check_gguf_file(p)
        return Model(p.stem, "file", source_path=p)
    raise HarnessError(f"unknown model '{ref}': not in {catalog_path()} and no such file (see `harness models list`)")


def require_present(m: Model) -> Path:
    if not m.path.exists():
        hint = {"file": "check the path",
                "path": f"it is your own file: fix source.path of '{m.name}' in {catalog_path()}"}.get(
            m.kind, f"run `harness models fetch {m.name}`")
        raise HarnessError(f"model '{m.name}' is not present at {m.path}: {hint}")
    check_gguf_file(m.path)
    from harness.models.store import changed_since_verified
    if (want := changed_since_verified(m.path)) is not None:
        raise HarnessError(f"model '{m.name}' at {m.path} is not the file that was verified (sha256 "
                           f"{want[:12]}...): it changed on disk; run `harness models fetch {m.name}` to get it "
                           "again (or verify it afresh)")
    return m.path
