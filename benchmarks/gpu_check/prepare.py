"""Prepare issue 47's GPU check on the CPU machine: what the device lacks, in one git-ignored folder to carry.

The device (docs/gpu.md, "The GPU check") has Python 3.12, numpy, click, psutil, tabulate and nvcc, but no
polars, gguf or llama-cpp-python, no network, and takes at most 64 MiB of working tree per call. This writes
.gpucheck/ (ignored through .git/info/exclude):

- llama.cpp.tar.xz: llama-cpp-python's vendored llama.cpp, trimmed to what a CUDA build of libllama/ggml and
  llama-server configures and compiles (no models, docs, tests, examples, web UI sources, other backends);
- site.tar.xz: llama_cpp's pure-Python package (the harness loads it through LLAMA_CPP_LIB_PATH) and the wheels
  the device lacks (CPython 3.12, manylinux x86_64), unpacked, shared objects stripped of their symbol tables
  (the dynamic symbols stay), xz: polars' runtime wheel alone (54 MB deflated) leaves too little room beside
  the repository;
- manifest.json: what went in;

then checks that the tree that travels (tracked and untracked-not-ignored files, plus .gpucheck) fits 64 MiB.
The models are tiny GGUFs from tests/tiny_gguf.py, written on the device (run.sh calls --models); a real pair
does not fit, and the sizes printed say by how much.
Run: .venv/bin/python benchmarks/gpu_check/prepare.py   (or make gpu-check-prepare)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LLAMA_VERSION = "0.3.36"
NATIVE_SRC = Path(os.environ.get("NATIVE_CACHE", Path.home() / ".cache/harness/native")) / "src"
PACK = ROOT / ".gpucheck"
WHEELS = ROOT / ".whl"
LIMIT = 64 * 2**20
# Distributions the device lacks (docs: its package list); llama_cpp's other needs (numpy, jinja2,
# typing-extensions) and gguf's (pyyaml, requests, tqdm) are there. Versions: this venv's, one each.
MISSING = ("polars", "polars-runtime-32", "gguf", "diskcache")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

# -- trimming llama.cpp -----------------------------------------------------------------------------------------
# Top-level entries of llama.cpp that the build configures (LLAMA_BUILD_TESTS/EXAMPLES/APP off); the rest
# (models/ 75 MB, docs/ 38 MB, gguf-py, conversion scripts, CI) is never read by CMake.
TOP_KEEP = {"CMakeLists.txt", "CMakePresets.json", "LICENSE", "licenses", "cmake", "common", "ggml", "include",
            "src", "tools", "vendor", "scripts"}
BACKENDS_KEEP = {"ggml-cpu", "ggml-cuda"}  # ggml_add_backend() enters only the enabled backends' folders
# tools/CMakeLists.txt enters every tool's folder, so each stays; these parts of them no target reads.
# The web UI is embedded empty (LLAMA_BUILD_UI and LLAMA_USE_PREBUILT_UI off): its CMake and templates suffice.
UI_KEEP = {"CMakeLists.txt", "ui.cpp.in", "ui.h.in", "sources.cmake"}
DROP_UNDER = ("tools/server/bench/", "tools/server/tests/", "tools/mtmd/tests/", "tools/mtmd/legacy-models/")
DROP_NAMES = ("tools/mtmd/test-", "tools/mtmd/tests.sh")
SCRIPTS_KEEP = {"scripts/ui-assets.cmake"}  # the UI target's one script


def keep(rel: str) -> bool:
    """Whether the trimmed tree holds llama.cpp's file `rel` (a POSIX path relative to its root)."""
    parts = rel.split("/")
    if parts[0] not in TOP_KEEP:
        return False
    if parts[0] == "scripts":
        return rel in SCRIPTS_KEEP
    if rel.startswith("ggml/src/ggml-") and len(parts) > 3 and parts[2] not in BACKENDS_KEEP:
        return False
    if rel.startswith("tools/ui/"):
        return len(parts) == 3 and parts[2] in UI_KEEP
    if rel.startswith(DROP_UNDER) or rel.startswith(DROP_NAMES):
        return False
    return not rel.endswith((".md", ".py"))


def trimmed_files(root: Path) -> list[str]:
    return sorted(rel for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                  and keep(rel := p.relative_to(root).as_posix()))


def _tar_xz(dest: Path, items: list[tuple[str, Path]]) -> None:
    """Write (name in the archive, file) pairs, sorted, with fixed owners and times: the same input, the same
    bytes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for name, path in sorted(items):
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    tmp.replace(dest)


def sdist_tree() -> Path:
    """llama-cpp-python's extracted sdist, as `make native` leaves it; fetched and extracted where missing."""
    tree = NATIVE_SRC / f"llama_cpp_python-{LLAMA_VERSION}"
    if not (tree / "vendor/llama.cpp/CMakeLists.txt").is_file():
        tgz = NATIVE_SRC / f"llama_cpp_python-{LLAMA_VERSION}.tar.gz"
        if not tgz.is_file():
            _pip("download", "-q", "--no-binary", ":all:", "--no-deps", "-d", str(NATIVE_SRC),
                 f"llama-cpp-python=={LLAMA_VERSION}")
        with tarfile.open(tgz) as t:
            t.extractall(NATIVE_SRC, filter="data")
    return tree


def pack_llama(tree: Path) -> tuple[int, int]:
    """llama.cpp.tar.xz from the sdist's vendored llama.cpp; returns (files kept, their bytes)."""
    src = tree / "vendor/llama.cpp"
    files = trimmed_files(src)
    _tar_xz(PACK / "llama.cpp.tar.xz", [(f"llama.cpp/{rel}", src / rel) for rel in files])
    return len(files), sum((src / rel).stat().st_size for rel in files)


# -- the Python packages ---------------------------------------------------------------------------------------
def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"], check=True)


def pins() -> dict[str, str]:
    return {name: version(name) for name in MISSING}


def fetch_wheels(dest: Path = WHEELS) -> list[Path]:
    """One wheel per missing distribution, for the device's CPython 3.12 on manylinux x86_64 (the device
    README's recipe); kept in .whl/ (ignored), so a second prepare downloads nothing."""
    want = pins()
    found = {name: _wheel(dest, name, v) for name, v in want.items()}
    need = [f"{n}=={v}" for n, v in want.items() if found[n] is None]
    if need:
        plats = [a for p in PLATFORMS for a in ("--platform", p)]
        _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
             "cp", *plats, "-d", str(dest), *need)
    wheels = [_wheel(dest, n, v) for n, v in want.items()]
    missing = [n for n, w in zip(want, wheels) if w is None]
    if missing:
        raise SystemExit(f"gpu-check: no wheel in {dest} for {', '.join(missing)}")
    return wheels  # type: ignore[return-value]


def _wheel(d: Path, name: str, ver: str) -> Path | None:
    hits = sorted(d.glob(f"{name.replace('-', '_')}-{ver}-*.whl")) if d.is_dir() else []
    return hits[-1] if hits else None


def site_items(wheels: list[Path], tree: Path, stage: Path) -> list[tuple[str, Path]]:
    """The files of site.tar.xz: each wheel unpacked as pip would put it in a --target folder (none of these has
    scripts or data to place), llama_cpp/ from the sdist and a dist-info naming it, which the harness's probe
    and system info read the version from."""
    items: list[tuple[str, Path]] = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
            if any(n.split("/", 1)[0].endswith(".data") for n in names):
                raise SystemExit(f"gpu-check: {w.name} has a .data folder: install it with pip instead")
            z.extractall(stage / w.stem)
        for so in (stage / w.stem).rglob("*.so"):  # polars': 178 MB, 40 of them its symbol table
            if shutil.which("strip"):
                subprocess.run(["strip", "--strip-unneeded", str(so)], check=True)
        items += [(n, stage / w.stem / n) for n in names]
    pkg = tree / "llama_cpp"
    items += [(f"llama_cpp/{p.relative_to(pkg).as_posix()}", p) for p in pkg.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and "server" not in p.relative_to(pkg).parts]
    meta = stage / "METADATA"
    meta.write_text(f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {LLAMA_VERSION}\n")
    items.append((f"llama_cpp_python-{LLAMA_VERSION}.dist-info/METADATA", meta))
    return items


# -- models ------------------------------------------------------------------------------------------------------
# The target a few MB (four layers, f16), the draft its first two layers and tables (the same seed draws the
# same weights per tensor name): they agree now and then, so speculation both accepts and rejects. 1,024 unused
# tokens pad the vocabulary past the 512 token ids that bench's probe decodes. Random weights: they test
# offload and equality, not speeds worth quoting.
_SHAPE = dict(seed=0, variant="padding", n_padding=1024, context_length=4096, n_embd=256, n_head=8, n_head_kv=4,
              n_ff=768, dtype="f16")
TINY = {"tiny-target.gguf": dict(_SHAPE, n_layer=4), "tiny-draft.gguf": dict(_SHAPE, n_layer=2)}


def write_models(dest: Path) -> list[Path]:
    sys.path.insert(0, str(ROOT))
    from tests.tiny_gguf import write_tiny_model
    return [write_tiny_model(dest / name, name=name.removesuffix(".gguf"), **kw) for name, kw in TINY.items()]


# -- the size that travels ---------------------------------------------------------------------------------------
def travelling_files(root: Path = ROOT) -> list[Path]:
    """Tracked and untracked-not-ignored files (what every device call sends), shared/ where there is one."""
    out = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=root, check=True,
                         capture_output=True).stdout.decode()
    files = [root / p for p in out.split("\0") if p]
    files += [p for p in (root / "shared").rglob("*") if p.is_file()] if (root / "shared").is_dir() else []
    return [p for p in files if p.is_file() and not p.is_symlink()]


def size_table(parts: dict[str, int], limit: int = LIMIT) -> tuple[str, bool]:
    """The carried sizes as lines, their total against the limit, and whether it fits."""
    total = sum(parts.values())
    lines = [f"{name:<40} {n / 2**20:8.2f} MiB" for name, n in parts.items()]
    lines.append(f"{'total (limit ' + format(limit / 2**20, 'g') + ' MiB)':<40} {total / 2**20:8.2f} MiB"
                 f"  {'fits' if total <= limit else 'OVER by ' + format((total - limit) / 2**20, '.2f') + ' MiB'}")
    return "\n".join(lines), total <= limit


def du(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ignore_locally(root: Path = ROOT) -> None:
    """.gpucheck/ and .whl/ in .git/info/exclude: ignored, so they travel only where a call carries them, and
    no `git add` takes 60 MB of binaries."""
    path = root / subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=root, check=True,
                                 capture_output=True, text=True).stdout.strip()
    have = path.read_text().splitlines() if path.is_file() else []
    new = [p for p in ("/.gpucheck/", "/.whl/") if p not in have]
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in [*have, *new]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-only", action="store_true", help="Only print the sizes of what is already there.")
    ap.add_argument("--models", metavar="DIR", help="Only write the tiny models into DIR (run.sh, on the device).")
    args = ap.parse_args(argv)
    if args.models:
        for m in write_models(Path(args.models)):
            print(f"{m} {m.stat().st_size / 2**20:.2f} MiB")
        return 0
    if not args.check_only:
        ignore_locally()
        tree = sdist_tree()
        n, raw = pack_llama(tree)
        print(f"llama.cpp trimmed: {n} files, {raw / 2**20:.1f} MiB -> {du(PACK / 'llama.cpp.tar.xz') / 2**20:.1f}"
              f" MiB xz (the vendored tree: {du(tree / 'vendor/llama.cpp') / 2**20:.0f} MiB)")
        wheels = fetch_wheels()
        stage = ROOT / "build/gpu-check-stage"
        _tar_xz(PACK / "site.tar.xz", site_items(wheels, tree, stage))
        print("wheels: " + ", ".join(f"{w.name} {w.stat().st_size / 2**20:.1f} MiB" for w in wheels))
        shutil.rmtree(PACK / "models", ignore_errors=True)
        (PACK / "manifest.json").write_text(json.dumps(
            {"llama_cpp_python": LLAMA_VERSION, "wheels": [w.name for w in wheels], "models": TINY}, indent=1) + "\n")
    repo = sum(p.stat().st_size for p in travelling_files())
    parts = {"repository (tracked + untracked, not ignored)": repo}
    parts |= {f".gpucheck/{p.name}": du(p) for p in sorted(PACK.iterdir())} if PACK.is_dir() else {}
    table, fits = size_table(parts)
    print(table)
    real = sorted((ROOT / "models").glob("*.gguf"), key=lambda p: p.stat().st_size)[:2]
    if len(real) == 2:
        over = sum(parts.values()) + sum(p.stat().st_size for p in real) - LIMIT
        print("not carried: the smallest real pair here, " + " + ".join(
            f"{p.name} {p.stat().st_size / 2**20:.0f} MiB" for p in real)
            + f" (GGUF weights barely compress), would put the call {over / 2**20:.0f} MiB over")
    if not fits:
        print("gpu-check: the carried tree is over the device's limit", file=sys.stderr)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
