"""The machine and software a run measured: for report headers."""
from __future__ import annotations

import platform
import socket
import time
from importlib.metadata import PackageNotFoundError, version

import psutil


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ver(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def collect() -> dict:
    from harness.llamacpp import amx_guard, gpu_offload_supported, system_info
    sysinfo = system_info()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": psutil.cpu_count(logical=True),
        "ram_bytes": psutil.virtual_memory().total,
        "gpu_offload": gpu_offload_supported(),
        "backend": "GPU offload available" if gpu_offload_supported() else "CPU only (no GPU offload in this build)",
        "llama_system_info": sysinfo,
        "amx_extra_buffers_disabled": amx_guard(),
        "packages": {p: _ver(p) for p in ("llama-cpp-python", "numpy", "polars", "harness", "gguf")},
    }


def header(system: dict) -> dict:
    """What names a machine in a comparison, from what collect() recorded."""
    pk = system.get("packages", {})
    return {"cpu": system.get("cpu", "?"), "cores": system.get("cores_physical"),
            "ram_gib": round(system["ram_bytes"] / 2**30) if system.get("ram_bytes") else None,
            "backend": system.get("backend", "?"), "llama-cpp-python": pk.get("llama-cpp-python", "?"),
            "harness": pk.get("harness", "?"), "host": system.get("host", "?"), "date": system.get("date", "?")}
