"""llama.cpp through llama-cpp-python's low-level API: one model and one context, batched decode with
logits only on the rows that need them, zero-copy numpy views of the logits, KV-cache rollback."""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import HarnessError

_backend_ready = False


def llama():
    """Import llama_cpp once, silence its logging, initialise the backend."""
    global _backend_ready
    import llama_cpp
    if not _backend_ready:
        if not os.environ.get("HARNESS_LLAMA_LOG"):
            _silence(llama_cpp)
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return llama_cpp


_log_cb = None


def _silence(llama_cpp) -> None:
    global _log_cb

    @llama_cpp.llama_log_callback
    def _quiet(level, text, user_data):
        return None

    _log_cb = _quiet  # keep a reference: llama.cpp calls it later
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


def gpu_offload_supported() -> bool:
    return bool(llama().llama_supports_gpu_offload())


GPU_BUILD_HINT = ('this llama-cpp-python build has no GPU offload; rebuild it with '
                  'make clean setup CMAKE_ARGS="-DGGML_CUDA=on" (or -DGGML_VULKAN=on / -DGGML_METAL=on)')


def require_offload(n_gpu_layers: int, what: str = "--ngl") -> None:
    if n_gpu_layers > 0 and not gpu_offload_supported():
        raise HarnessError(f"{what} {n_gpu_layers} asks for GPU offload, but {GPU_BUILD_HINT}")


def default_threads() -> int:
    import psutil
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


MIN_CTX = 64


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 2048
    n_batch: int = 512
    n_gpu_layers: int = 0
    threads: int = 0  # 0: physical cores

    def __post_init__(self):
        if self.n_ctx < MIN_CTX:
            raise HarnessError(f"--n-ctx must be at least {MIN_CTX}, got {self.n_ctx}")
        if self.threads < 0:
            raise HarnessError(f"--threads must be >= 0 (0 = physical cores), got {self.threads}")
        if self.n_gpu_layers < 0:
            raise HarnessError(f"--ngl/--ngl-draft must be >= 0 (layers offloaded to the GPU), got {self.n_gpu_layers}")

    def resolved_threads(self) -> int:
        return self.threads or default_threads()


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
            raise HarnessError("the model has no chat template; use a raw-text prompt (chat: false)")
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (self._ll.llama_chat_message * len(keep))(*[self._ll.llama_chat_message(r, c) for r, c in keep])
        size = sum(len(c) + len(r) for r, c in keep) * 2 + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = self._ll.llama_chat_apply_template(tmpl, arr, len(keep), True, buf, size)
            if n < 0:
                raise HarnessError("llama.cpp does not support this model's chat template; use chat: false")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1
        raise HarnessError("chat template output did not fit its buffer")


class Engine:
    """One model, one context, sequence 0. Callers keep track of positions; trim() rolls the KV cache back."""

    def __init__(self, path: Path, cfg: EngineConfig):
        require_offload(cfg.n_gpu_layers)
        ll = llama()
        self._ll = ll
        self.path = Path(path)
        self.cfg = cfg
        t0 = time.perf_counter()
        self.model = load_model(self.path, cfg.n_gpu_layers)
        self.vocab = Vocab(self.model)
        self.n_vocab = self.vocab.n_vocab
        cp = ll.llama_context_default_params()
        cp.n_ctx = cfg.n_ctx
        cp.n_batch = cfg.n_batch
        cp.n_ubatch = cfg.n_batch
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = cfg.resolved_threads()
        cp.no_perf = False
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise HarnessError(f"llama.cpp could not create a context for {self.path} (n_ctx={cfg.n_ctx}); "
                               "try a smaller context")
        # llama.cpp pads n_ctx up (to a multiple of 256); what the user asked for is the limit they are told of
        self.n_ctx_alloc = ll.llama_n_ctx(self.ctx)
        self.n_ctx = min(self.n_ctx_alloc, cfg.n_ctx)
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(cfg.n_batch, 0, 1)
        self.load_ms = (time.perf_counter() - t0) * 1000
        self.n_past = 0

    # -- decoding -------------------------------------------------------------------------------------------
    def decode(self, tokens: list[int], logits: str = "last") -> np.ndarray | None:
        """Append tokens at n_past. logits: 'last', 'all' or 'none'. Returns a [rows, n_vocab] float32 view
        into llama.cpp's buffer (valid until the next decode), or None."""
        n = len(tokens)
        if self.n_past + n > self.n_ctx:
            raise HarnessError(f"context full: {self.n_past} + {n} tokens exceed n_ctx={self.n_ctx}")
        if logits == "all" and n > self.cfg.n_batch:
            raise HarnessError("logits for all rows are only kept for blocks up to n_batch tokens")
        rows = 0
        for start in range(0, n, self.cfg.n_batch):
            chunk = tokens[start:start + self.cfg.n_batch]
            last_chunk = start + len(chunk) == n
            b = self.batch
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                want = logits == "all" or (logits == "last" and last_chunk and i == len(chunk) - 1)
                b.logits[i] = want
            b.n_tokens = len(chunk)
            rc = self._ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise HarnessError(f"llama_decode failed with code {rc} at position {self.n_past}")
            self.n_past += len(chunk)
            rows = len(chunk) if logits == "all" else (1 if logits == "last" and last_chunk else 0)
        if logits == "none" or rows == 0:
            return None
        ptr = self._ll.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

    def trim(self, n_keep: int) -> None:
        """Forget every position >= n_keep (KV rollback after a rejection)."""
        if n_keep < self.n_past:
            if not self._ll.llama_memory_seq_rm(self.mem, 0, n_keep, -1):
                raise HarnessError("llama.cpp could not roll the KV cache back (this model's memory type "
                                   "does not support partial removal)")
            self.n_past = n_keep

    def reset(self) -> None:
        self._ll.llama_memory_clear(self.mem, True)
        self.n_past = 0

    # -- facts ----------------------------------------------------------------------------------------------
    def perf(self) -> dict:
        d = self._ll.llama_perf_context(self.ctx)
        return {"p_eval_ms": d.t_p_eval_ms, "eval_ms": d.t_eval_ms, "n_p_eval": d.n_p_eval, "n_eval": d.n_eval}

    def perf_reset(self) -> None:
        self._ll.llama_perf_context_reset(self.ctx)

    def kv_bytes(self) -> int:
        """KV cache size of the allocated context at f16 K and V."""
        ll = self._ll
        n_layer = ll.llama_model_n_layer(self.model)
        n_head, n_head_kv = ll.llama_model_n_head(self.model), ll.llama_model_n_head_kv(self.model)
        head_dim = ll.llama_model_n_embd(self.model) // max(n_head, 1)
        arch = self.vocab.meta("general.architecture") or ""
        k_len = int(self.vocab.meta(f"{arch}.attention.key_length") or head_dim)
        v_len = int(self.vocab.meta(f"{arch}.attention.value_length") or head_dim)
        return self.n_ctx_alloc * n_layer * n_head_kv * (k_len + v_len) * 2

    def close(self) -> None:
        ll = self._ll
        if getattr(self, "batch", None) is not None:
            ll.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            ll.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            ll.llama_model_free(self.model)
            self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def teacher_forced(engine, prompt_tokens: list[int], output: list[int]) -> np.ndarray:
    """Logits [len(output), n_vocab] predicting each output token, from one batched pass over the prompt and
    output (chunks of n_batch): row j comes from the position of the token before output[j]."""
    engine.reset()
    if not output:
        return np.zeros((0, engine.n_vocab), dtype=np.float32)
    engine.decode(prompt_tokens[:-1], logits="none")
    block = [prompt_tokens[-1], *output[:-1]]
    out = np.empty((len(block), engine.n_vocab), dtype=np.float32)
    nb = engine.cfg.n_batch
    for s in range(0, len(block), nb):
        chunk = block[s:s + nb]
        out[s:s + len(chunk)] = engine.decode(chunk, logits="all")  # copy: the view dies at the next decode
    return out
