"""The llama.cpp library through llama-cpp-python: loading it (its log taken over), what the build offers, a
model's weights and its vocabulary. harness.engine builds contexts on top."""
from __future__ import annotations

import ctypes
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from harness.errors import HarnessError

_backend_ready = False


def llama():
    """Import llama_cpp once, take over its logging (quiet unless HARNESS_LLAMA_LOG), initialise the backend."""
    global _backend_ready
    import llama_cpp
    if not _backend_ready:
        _take_log(llama_cpp, echo=bool(os.environ.get("HARNESS_LLAMA_LOG")))
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return llama_cpp


_log_cb = None
_capture: list[str] | None = None


def _take_log(llama_cpp, echo: bool) -> None:
    global _log_cb

    @llama_cpp.llama_log_callback
    def _log(level, text, user_data):
        if _capture is not None:
            _capture.append(text.decode(errors="replace"))
        if echo:
            sys.stderr.write(text.decode(errors="replace"))

    _log_cb = _log  # keep a reference: llama.cpp calls it later
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


@contextmanager
def captured_log():
    """llama.cpp's log lines while the block runs (its memory breakdown is only logged). A nested block takes
    its lines for itself."""
    global _capture
    outer, _capture = _capture, []
    try:
        yield _capture
    finally:
        _capture = outer


# llama.cpp's lines "<buffer type> <what> buffer size = <x> MiB", logged while a model and a context are made
_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|RS|output|compute) buffer size =\s*([\d.]+) MiB")


def memory_breakdown(log: str) -> list[dict]:
    """[{buffer, kind, bytes}] from llama.cpp's log: weights (model), KV cache (kv; rs for recurrent state),
    logits (output) and the compute buffer, per buffer type (CPU, CPU_Mapped, CUDA0, CUDA_Host, ...). A compute
    buffer is logged each time the scheduler reserves one: the last size per buffer type stands."""
    out: dict[tuple[str, str], int] = {}
    for name, kind, mib in _BUFFER_LINE.findall(log):
        key, size = (name, kind.lower()), int(round(float(mib) * 2**20))
        out[key] = size if kind == "compute" else out.get(key, 0) + size
    return [{"buffer": b, "kind": k, "bytes": v} for (b, k), v in out.items()]


def on_host(buffer: str) -> bool:
    """Host memory: the CPU's buffers and the pinned host buffers of a GPU backend (CUDA_Host, ...)."""
    return buffer.startswith("CPU") or buffer.endswith("_Host")


class NoChatTemplate(HarnessError):
    """A chat prompt on a model without a chat template llama.cpp applies: a caller whose prompts are not the
    user's (server-check) says what to do instead."""


def gpu_offload_supported() -> bool:
    return bool(llama().llama_supports_gpu_offload())


GPU_BUILD_HINT = ('this llama-cpp-python build has no GPU offload; rebuild it with '
                  'make clean setup CMAKE_ARGS="-DGGML_CUDA=on" (or -DGGML_VULKAN=on / -DGGML_METAL=on)')


def require_offload(n_gpu_layers: int, what: str = "--ngl") -> None:
    if n_gpu_layers > 0 and not gpu_offload_supported():
        raise HarnessError(f"{what} {n_gpu_layers} asks for GPU offload, but {GPU_BUILD_HINT}")


def system_info() -> str:
    return llama().llama_print_system_info().decode(errors="replace").strip()


def amx_guard() -> bool:
    """True when this build has ggml's AMX kernels, which segfault on batched decodes of quantized weights
    (ggml-org/llama.cpp#20824). The Makefile builds without them; a user's own build gets the extra
    buffer types switched off instead (slower: no weight repacking), and the report says so."""
    return "AMX_INT8 = 1" in system_info()


def load_model(path: Path, n_gpu_layers: int = 0, vocab_only: bool = False):
    ll = llama()
    params = ll.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.vocab_only = vocab_only
    if amx_guard():
        params.use_extra_bufts = False
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise HarnessError(f"llama.cpp could not load {path} (not a valid or supported GGUF model, or truncated)")
    return model


class Vocab:
    """Tokenizer side of a model (works on a vocab-only load)."""

    def __init__(self, model):
        ll = llama()
        self._ll = ll
        self.model = model
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode()
        cap = len(data) + 8
        buf = (self._ll.llama_token * cap)()
        n = self._ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (self._ll.llama_token * cap)()
            n = self._ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def text(self, token: int) -> bytes:
        return self._ll.llama_vocab_get_text(self.vocab, token) or b""

    def attr(self, token: int) -> int:
        return int(self._ll.llama_vocab_get_attr(self.vocab, token))

    def is_eog(self, token: int) -> bool:
        return bool(self._ll.llama_vocab_is_eog(self.vocab, token))

    def specials(self) -> dict:
        ll, v = self._ll, self.vocab
        return {"bos": ll.llama_vocab_bos(v), "eos": ll.llama_vocab_eos(v), "eot": ll.llama_vocab_eot(v),
                "pad": ll.llama_vocab_pad(v), "add_bos": bool(ll.llama_vocab_get_add_bos(v)),
                "add_eos": bool(ll.llama_vocab_get_add_eos(v))}

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = self._ll.llama_model_meta_val_str(self.model, key.encode(), buf, 256)
        if n < 0:
            return None
        if n >= 256:
            buf = ctypes.create_string_buffer(n + 1)
            self._ll.llama_model_meta_val_str(self.model, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        t = self._ll.llama_model_chat_template(self.model, None)
        return t.decode("utf-8", errors="replace") if t else None

    def apply_chat_template(self, messages: list[dict]) -> str:
        tmpl = self._ll.llama_model_chat_template(self.model, None)
        if not tmpl:
            raise NoChatTemplate("the model has no chat template; use a raw-text prompt (chat: false)")
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (self._ll.llama_chat_message * len(keep))(*[self._ll.llama_chat_message(r, c) for r, c in keep])
        size = sum(len(c) + len(r) for r, c in keep) * 2 + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = self._ll.llama_chat_apply_template(tmpl, arr, len(keep), True, buf, size)
            if n < 0:
                raise NoChatTemplate("llama.cpp does not support this model's chat template; use chat: false")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1
        raise HarnessError("chat template output did not fit its buffer")
