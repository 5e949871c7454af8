"""Derived quantizations, built with llama.cpp's own quantizer through llama-cpp-python."""
from __future__ import annotations

import ctypes
import os
import tempfile
import time

import click

from harness.errors import HarnessError
from harness.models.catalog import Model, models_dir
from harness.models.store import mark_verified, read_sidecar, sha256_file


def ftype_code(ftype: str) -> int:
    import llama_cpp
    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        prefix = "LLAMA_FTYPE_MOSTLY_"
        known = sorted(k.removeprefix(prefix) for k in dir(llama_cpp) if k.startswith(prefix))
        raise HarnessError(f"unknown quantization type '{ftype}'; llama.cpp knows: {', '.join(known)}")
    return code


def derive(m: Model, src: Model) -> str:
    from harness.llamacpp import llama
    llama_cpp = llama()  # silences llama.cpp's per-tensor log
    if not src.path.exists():
        raise HarnessError(f"derived model '{m.name}' needs its source '{src.name}', which is not present at "
                           f"{src.path}: run `harness models fetch {src.name}`")
    code = ftype_code(m.derive_ftype)
    dest_dir = models_dir()
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".partial-{m.name}-", suffix=".gguf", dir=dest_dir)
    os.close(fd)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = code
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        click.echo(f"{m.name}: quantizing {src.name} -> {m.derive_ftype}", err=True)
        t0 = time.perf_counter()
        rc = llama_cpp.llama_model_quantize(str(src.path).encode(), tmp.encode(), ctypes.byref(params))
        if rc != 0:
            raise HarnessError(f"llama.cpp failed to quantize {src.name} to {m.derive_ftype} (code {rc})")
        seconds = time.perf_counter() - t0
        os.chmod(tmp, 0o644)
        os.replace(tmp, m.path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    sha = sha256_file(m.path)
    src_info = read_sidecar(src.path)
    mark_verified(m.path, sha, source="derived", built_sha256=sha, derived_from=src.name,
                  derived_from_quant=src.quant, derived_from_sha256=src_info.get("sha256", src.sha256),
                  ftype=m.derive_ftype, requantized=True, quantize_seconds=round(seconds, 2),
                  llama_cpp_python=llama_cpp.__version__,
                  note=f"requantized from {src.quant or 'a quantized'} source; never better than its source")
    return m.path
