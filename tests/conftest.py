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


@pytest.fixture(scope="session")
def smol() -> Path:
    return real_model("smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def smol_q2k() -> Path:
    return real_model("smollm2-135m-instruct-q2_k")


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory):
    from tests.tiny_gguf import make_fixture_set
    return make_fixture_set(tmp_path_factory.mktemp("tiny"))


def gpu_build() -> bool:
    """True on a llama-cpp-python built with GPU offload (CUDA, Vulkan, Metal), where the CPU-only refusals
    cannot happen and the report's backend line differs."""
    from harness.engine import gpu_offload_supported
    return gpu_offload_supported()


def skip_on_gpu_build(what: str) -> None:
    if gpu_build():
        pytest.skip(f"{what}: this llama-cpp-python has GPU offload")
