"""benchmarks/gpu_check (issue 47): the cheap parts, with no build, download or GPU: which llama.cpp files the
trimmed tree keeps, the size check, and run.sh's refusal where CUDA or a GPU is missing."""
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "gpu_check" / "run.sh"
spec = importlib.util.spec_from_file_location("gpu_check_prepare", ROOT / "benchmarks" / "gpu_check" / "prepare.py")
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)


@pytest.mark.parametrize("rel", [
    "CMakeLists.txt", "LICENSE", "cmake/license.cmake", "include/llama.h", "src/llama.cpp",
    "common/arg.cpp", "ggml/CMakeLists.txt", "ggml/src/ggml.c", "ggml/src/CMakeLists.txt",
    "ggml/src/ggml-cuda/fattn.cu", "ggml/src/ggml-cuda/template-instances/fattn-vec-instance-q4_0-q4_0.cu",
    "ggml/src/ggml-cpu/ggml-cpu.c", "ggml/include/ggml-cuda.h", "vendor/miniaudio/miniaudio.h",
    "tools/CMakeLists.txt", "tools/server/server.cpp", "tools/server/CMakeLists.txt", "tools/ui/CMakeLists.txt",
    "tools/ui/ui.cpp.in", "tools/mtmd/mtmd.cpp", "tools/mtmd/models/llama4.cpp", "tools/llama-bench/CMakeLists.txt",
    "scripts/ui-assets.cmake",
])
def test_trim_keeps_what_the_build_reads(rel):
    assert prepare.keep(rel)


@pytest.mark.parametrize("rel", [
    "models/ggml-vocab-llama-bpe.gguf", "docs/build.md", "tests/test-backend-ops.cpp", "examples/CMakeLists.txt",
    "gguf-py/gguf/gguf.py", "convert_hf_to_gguf.py", "README.md", ".github/workflows/build.yml", "app/llama.cpp",
    "ggml/src/ggml-vulkan/ggml-vulkan.cpp", "ggml/src/ggml-metal/CMakeLists.txt", "ggml/src/ggml-hip/CMakeLists.txt",
    "tools/ui/src/app.html", "tools/ui/package-lock.json", "tools/server/tests/unit/test_basic.py",
    "tools/server/bench/bench.py", "tools/mtmd/test-3.mp4", "tools/mtmd/tests/foo.sh", "scripts/sync_vendor.py",
    "tools/server/README.md",
])
def test_trim_drops_what_no_target_reads(rel):
    assert not prepare.keep(rel)


def test_trimmed_files_walks_a_tree(tmp_path):
    for rel in ("CMakeLists.txt", "docs/a.md", "ggml/src/ggml-cuda/x.cu", "ggml/src/ggml-sycl/y.cpp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert prepare.trimmed_files(tmp_path) == ["CMakeLists.txt", "ggml/src/ggml-cuda/x.cu"]


def test_size_table_says_whether_it_fits():
    text, fits = prepare.size_table({"repository": 30 * 2**20, ".gpucheck/site.tar.xz": 20 * 2**20})
    assert fits and "50.00 MiB  fits" in text
    text, fits = prepare.size_table({"repository": 30 * 2**20, ".gpucheck/site.tar.xz": 40 * 2**20})
    assert not fits and "OVER by 6.00 MiB" in text


def test_the_repository_is_what_travels():
    files = {p.relative_to(ROOT).as_posix() for p in prepare.travelling_files()}
    assert "benchmarks/gpu_check/run.sh" in files and "pyproject.toml" in files
    assert not any(f.startswith((".venv/", "models/", ".gpucheck/", ".whl/")) for f in files)


def _run_sh(tmp_path, path: str):
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_CHECK_CPU_DRY_RUN", "OUT")}
    env |= {"PATH": path, "GPU_CHECK_WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out")}
    return subprocess.run(["/bin/bash", str(RUN)], env=env, capture_output=True, text=True, timeout=30)


def test_refuses_without_nvcc(tmp_path):
    r = _run_sh(tmp_path, str(tmp_path))  # an empty PATH: no nvcc, no nvidia-smi
    assert r.returncode == 3 and "no nvcc" in r.stderr
    assert not (tmp_path / "work").exists()  # refused before anything was built or written


@pytest.mark.parametrize("smi", [None, "#!/bin/sh\necho 'No devices were found'\n"])
def test_refuses_without_a_gpu(tmp_path, smi):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    tools = {"nvcc": "#!/bin/sh\necho nvcc\n"} | ({"nvidia-smi": smi} if smi else {})
    for name, text in tools.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    r = _run_sh(tmp_path, f"{bin_}:/usr/bin:/bin")
    assert r.returncode == 3 and "no NVIDIA GPU" in r.stderr
    assert not (tmp_path / "work").exists()


def test_run_sh_usage(tmp_path):
    r = subprocess.run(["/bin/bash", str(RUN), "--gpu"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr
