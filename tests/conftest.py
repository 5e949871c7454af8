import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


def real_model(name: str) -> Path:
    """A catalog model the test suite needs; `make test` fetches it first."""
    p = MODELS / f"{name}.gguf"
    if not p.exists():
        pytest.fail(f"{p} is missing: run `make test-models` (make test does it)")
    return p


@pytest.fixture(scope="session", autouse=True)
def probe_cache(tmp_path_factory):
    """The suite's own cache of recent probes (bench.probe): shared by its many short runs, apart from the
    user's."""
    import os
    before = os.environ.get("HARNESS_CACHE")
    os.environ["HARNESS_CACHE"] = str(tmp_path_factory.mktemp("harness-cache"))
    yield Path(os.environ["HARNESS_CACHE"])
    if before is None:
        del os.environ["HARNESS_CACHE"]
    else:
        os.environ["HARNESS_CACHE"] = before


@pytest.fixture(scope="session")
def smol() -> Path:
    return real_model("smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def smol_q2k() -> Path:
    return real_model("smollm2-135m-instruct-q2_k")


@pytest.fixture(scope="session")
def smol_pair(smol, smol_q2k):
    """SmolLM2 and its Q2_K as target and draft, one sequence of 512 positions, batches of 64."""
    from harness.engine import EngineConfig
    from tests.helpers import engine_pair
    with engine_pair(smol, smol_q2k, EngineConfig(n_ctx=512, n_batch=64)) as pair:
        yield pair


@pytest.fixture(scope="session")
def smol_slots(smol, smol_q2k):
    """SmolLM2 and its Q2_K as target and draft, over three sequences of 256 positions each."""
    from harness.engine import Engine, EngineConfig
    cfg = EngineConfig(n_ctx=3 * 256, n_seq=3, threads=2)
    t, d = Engine(smol, cfg), Engine(smol_q2k, cfg)
    yield t, d
    t.close()
    d.close()


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory):
    from tests.tiny_gguf import make_fixture_set
    return make_fixture_set(tmp_path_factory.mktemp("tiny"))


def gpu_build() -> bool:
    """True on a llama-cpp-python built with GPU offload (CUDA, Vulkan, Metal), where the CPU-only refusals
    cannot happen and the report's backend line differs."""
    from harness.llamacpp import gpu_offload_supported
    return gpu_offload_supported()


def skip_on_gpu_build(what: str) -> None:
    if gpu_build():
        pytest.skip(f"{what}: this llama-cpp-python has GPU offload")


# -- runs shared by the whole session ------------------------------------------------------------------------
# Tests that only read a run share one of these; a test that changes a run works on a copy (helpers.copy_run).
# The two timed runs are one sweep at 2 threads and at 1 (two "machines" for compare and predict); the replay
# run has the same prompts and policies, so predict can put its replay beside the 1-thread run.
T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"
CATEGORIES = ("code", "chat")
POLICIES = ("greedy", "T=0.8 top_p=0.9")
# tiny prompts (15-30 tokens; two repeat themselves, for the n-gram lookup): prompt evaluation, not decoding, is
# most of a small model's time on 2 cores
PROMPT_FILE = ROOT / "tests" / "data" / "prompts.jsonl"
PROMPTS = ("--prompts", str(PROMPT_FILE), "--per-category", "2", "--max-tokens", "12", "--temp", "0,0.8",
           "--top-p", "0.9")
SWEEP = ("--target", T, "--draft", f"{D},ngram:2", "--gamma", "2", *PROMPTS, "--paired")


def _bench(out: Path, *args) -> Path:
    from tests.helpers import harness, only_run
    r = harness("bench", *args, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return only_run(out)


@pytest.fixture(scope="session")
def timed_run(tmp_path_factory, smol, smol_q2k) -> Path:
    """The sweep at 2 threads, its reports under results/runA (nested: they must land inside --out)."""
    return _bench(tmp_path_factory.mktemp("timed") / "results" / "runA", *SWEEP, "--threads", "2")


@pytest.fixture(scope="session")
def timed_run_t1(tmp_path_factory, smol, smol_q2k) -> Path:
    return _bench(tmp_path_factory.mktemp("timed_t1"), *SWEEP, "--threads", "1")


@pytest.fixture(scope="session")
def replay_run(tmp_path_factory, smol, smol_q2k) -> Path:
    """Every prompt replayed through both proposers under both rules, then a timed subset."""
    return _bench(tmp_path_factory.mktemp("replay"), "--target", T, "--draft", f"{D},ngram:2", "--gamma", "1,2,3",
                  *PROMPTS, "--verify", "leviathan,exact", "--replay", "--replay-gamma", "3", "--timed-subset", "1",
                  "--paired", "--threads", "2")


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, smol) -> Path:
    """A finished two-configuration run (the baseline and ngram:2 at gamma 2): what the damage cases copy."""
    from tests.helpers import FAST, harness, only_run
    out = tmp_path_factory.mktemp("small")
    r = harness("bench", *FAST, "--allow-busy", "--out", out)
    assert r.returncode == 0, r.stderr
    return only_run(out)


@pytest.fixture(scope="session")
def calibrations(tmp_path_factory, smol, smol_q2k) -> tuple[list[Path], str]:
    """Both models calibrated at 1 thread (the other "machine"), and what `harness calibrate` printed."""
    from tests.helpers import harness
    out = tmp_path_factory.mktemp("cal")
    printed = ""
    for m in (T, D):
        r = harness("calibrate", m, "--threads", "1", "--k-max", "4", "--reps", "2", "--out", str(out))
        assert r.returncode == 0, r.stderr
        printed += r.stdout
    return [out / f"{m}-t1-ngl0.json" for m in (T, D)], printed


@pytest.fixture
def fake(tmp_path) -> Path:
    """tests/fake_llama_server.py as an executable named llama-server, the way a binary or a user's command names
    the real one."""
    p = tmp_path / "bin" / "llama-server"
    p.parent.mkdir()
    p.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name('fake_llama_server.py')} \"$@\"\n")
    p.chmod(0o755)
    return p


# -- the catalog's own places (models.catalog, models.fetch, bench.prepare)
@pytest.fixture
def env(tmp_path, monkeypatch):
    """HARNESS_MODELS_DIR, HARNESS_CATALOG and HARNESS_PYPI_FIND_LINKS inside tmp_path."""
    monkeypatch.setenv("HARNESS_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HARNESS_CATALOG", str(tmp_path / "models.toml"))
    monkeypatch.setenv("HARNESS_PYPI_FIND_LINKS", str(tmp_path / "wheels"))
    (tmp_path / "wheels").mkdir()
    return tmp_path


@pytest.fixture
def own_models(tmp_path, smol):
    """The target and its sidecar in a models directory of the test's own (HARNESS_MODELS_DIR), to change."""
    import shutil
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(smol, d / smol.name)
    shutil.copy(smol.with_name(smol.name + ".json"), d / (smol.name + ".json"))
    return d
