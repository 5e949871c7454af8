"""llama.cpp through llama-cpp-python's low-level API: one model and one context, batched decode with
logits only on the rows that need them, zero-copy numpy views of the logits, KV-cache rollback."""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import HarnessError
from harness.llamacpp import Vocab, captured_log, llama, load_model, memory_breakdown, require_offload

# llama.cpp's -ctk/-ctv types
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN = ("auto", "on", "off")


def cache_type(name: str):
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType[name.upper()]


def cache_bytes(name: str, elements: int) -> int:
    from gguf import GGML_QUANT_SIZES
    block, size = GGML_QUANT_SIZES[cache_type(name)]
    return elements // block * size


def quantized_cache(name: str) -> bool:
    return name not in ("f32", "f16", "bf16")


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
    cache_k: str = "f16"
    cache_v: str = "f16"
    flash_attn: str = "auto"
    n_ubatch: int = 0  # 0: n_batch
    n_seq: int = 1  # sequences decoded together (llama-server's -np): each gets n_ctx / n_seq positions
    kv_unified: bool = False  # one KV buffer shared by the sequences (llama-server's -kvu); else one per sequence

    def __post_init__(self):
        for what, v in (("K", self.cache_k), ("V", self.cache_v)):
            if v not in CACHE_TYPES:
                raise HarnessError(f"unknown {what} cache type '{v}' (known: {', '.join(CACHE_TYPES)})")
        if self.flash_attn not in FLASH_ATTN:
            raise HarnessError(f"--flash-attn: unknown value '{self.flash_attn}' (use {', '.join(FLASH_ATTN)})")
        if quantized_cache(self.cache_v) and self.flash_attn == "off":
            raise HarnessError(f"a quantized V cache ({self.cache_v}) needs flash attention in llama.cpp: use "
                               "--flash-attn on (or auto), or an f16 V cache")
        if not 0 <= self.n_ubatch <= self.n_batch:
            raise HarnessError(f"--ubatch must be between 1 and the batch size {self.n_batch}, got {self.n_ubatch}")
        if self.n_ctx < MIN_CTX:
            raise HarnessError(f"--n-ctx must be at least {MIN_CTX}, got {self.n_ctx}")
        if self.threads < 0:
            raise HarnessError(f"--threads must be >= 0 (0 = physical cores), got {self.threads}")
        if self.n_gpu_layers < 0:
            raise HarnessError(f"--ngl/--ngl-draft must be >= 0 (layers offloaded to the GPU), got {self.n_gpu_layers}")
        if self.n_seq < 1:
            raise HarnessError(f"--parallel must be >= 1, got {self.n_seq}")

    def resolved_threads(self) -> int:
        return self.threads or default_threads()

    @property
    def ubatch(self) -> int:
        return self.n_ubatch or self.n_batch


def _flash_attn_used(log: str, asked: str) -> bool | None:
    """Whether the context runs flash attention: llama.cpp logs what "auto" resolved to."""
    if asked != "auto":
        return asked == "on"
    found = re.findall(r"(?:Flash Attention|flash_attn\s+=) (enabled|disabled)", log)
    return None if not found else found[-1] == "enabled"


class Engine:
    """One model, one context. decode/trim/reset work on sequence 0 and keep its position; decode_rows, seq_trim
    and seq_clear serve several sequences (cfg.n_seq) whose positions the caller keeps."""

    def __init__(self, path: Path, cfg: EngineConfig):
        require_offload(cfg.n_gpu_layers)
        ll = llama()
        self._ll = ll
        self.path = Path(path)
        self.cfg = cfg
        t0 = time.perf_counter()
        with captured_log() as log:
            self.model = load_model(self.path, cfg.n_gpu_layers)
            self.vocab = Vocab(self.model)
            self.n_vocab = self.vocab.n_vocab
            cp = ll.llama_context_default_params()
            cp.n_ctx = cfg.n_ctx
            cp.n_batch = cfg.n_batch
            cp.n_ubatch = cfg.ubatch
            cp.n_seq_max = cfg.n_seq
            cp.kv_unified = cfg.kv_unified
            cp.n_threads = cp.n_threads_batch = cfg.resolved_threads()
            cp.no_perf = False
            cp.type_k, cp.type_v = int(cache_type(cfg.cache_k)), int(cache_type(cfg.cache_v))
            cp.flash_attn_type = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                  "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}[cfg.flash_attn]
            if cfg.flash_attn == "on" and cfg.n_gpu_layers > 0:
                self._require_flash_attn(cp)
            self.ctx = ll.llama_init_from_model(self.model, cp)
        text = "".join(log)
        if not self.ctx:
            ll.llama_model_free(self.model)
            why = [ln.strip() for ln in text.splitlines() if "error" in ln.lower() or "failed" in ln.lower()]
            raise HarnessError(f"llama.cpp could not create a context for {self.path} (n_ctx={cfg.n_ctx}, KV "
                               f"{cfg.cache_k}/{cfg.cache_v}, flash attention {cfg.flash_attn})"
                               + (f": {why[-1]}" if why else "; try a smaller context"))
        self.memory = memory_breakdown(text)
        self.flash_attn = _flash_attn_used(text, cfg.flash_attn)
        # llama.cpp pads n_ctx up (to a multiple of 256); what the user asked for is the limit they are told of
        self.n_ctx_alloc = ll.llama_n_ctx(self.ctx)
        self.n_ctx = min(ll.llama_n_ctx_seq(self.ctx), cfg.n_ctx // cfg.n_seq)  # each sequence's positions
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(cfg.n_batch, 0, 1)
        self.load_ms = (time.perf_counter() - t0) * 1000

    def _require_flash_attn(self, cp) -> None:
        """llama.cpp runs "on" as asked even where the device lacks the kernel (the op then falls back to the
        CPU); only "auto" checks. So a probe context under auto asks, and "on" is refused where it says no."""
        ll = self._ll
        auto = type(cp).from_buffer_copy(cp)
        auto.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_AUTO
        with captured_log() as log:
            probe = ll.llama_init_from_model(self.model, auto)
        if probe:
            ll.llama_free(probe)
        if _flash_attn_used("".join(log), "auto") is False:
            ll.llama_model_free(self.model)
            raise HarnessError(f"--flash-attn on: llama.cpp finds no flash attention on this backend for "
                               f"{self.path.name} (its auto mode turns it off, and on would run it on the CPU): use "
                               "--flash-attn auto or off")

    @property
    def n_past(self) -> int:
        """Sequence 0's positions in the KV cache, where decode() appends: llama.cpp's count, no bookkeeping."""
        return self._ll.llama_memory_seq_pos_max(self.mem, 0) + 1

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
            b, at = self.batch, self.n_past
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = at + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                want = logits == "all" or (logits == "last" and last_chunk and i == len(chunk) - 1)
                b.logits[i] = want
            b.n_tokens = len(chunk)
            rc = self._ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise HarnessError(f"llama_decode failed with code {rc} at position {at}")
            rows = len(chunk) if logits == "all" else (1 if logits == "last" and last_chunk else 0)
        if logits == "none" or rows == 0:
            return None
        ptr = self._ll.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

    def decode_rows(self, rows: list[tuple[int, int, int, bool]]) -> np.ndarray | None:
        """One llama_decode of (sequence, position, token, wants logits) rows, at most n_batch of them. Returns
        the logits of the rows that want them, in row order, as a view (valid until the next decode), or None."""
        if len(rows) > self.cfg.n_batch:
            raise HarnessError(f"{len(rows)} rows exceed the batch size {self.cfg.n_batch}")
        b = self.batch
        for i, (seq, pos, tok, want) in enumerate(rows):
            if pos >= self.n_ctx:
                raise HarnessError(f"context full: sequence {seq} reached position {pos}, n_ctx per sequence is "
                                   f"{self.n_ctx}")
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, want
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        rc = self._ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise HarnessError(f"llama_decode failed with code {rc} on a batch of {len(rows)} rows")
        wanted = sum(1 for r in rows if r[3])
        if not wanted:
            return None
        return np.ctypeslib.as_array(self._ll.llama_get_logits(self.ctx), shape=(wanted, self.n_vocab))

    def prefill(self, tokens: list[int], seq: int = 0) -> None:
        """tokens into sequence seq from position 0 (which the caller has emptied), no logits, n_batch at a time."""
        nb = self.cfg.n_batch
        for i in range(0, len(tokens), nb):
            self.decode_rows([(seq, i + j, t, False) for j, t in enumerate(tokens[i:i + nb])])

    def seq_trim(self, seq: int, n_keep: int) -> None:
        """Forget sequence seq's positions >= n_keep (KV rollback after a rejection)."""
        if not self._ll.llama_memory_seq_rm(self.mem, seq, n_keep, -1):
            raise HarnessError("llama.cpp could not roll the KV cache back (this model's memory type "
                               "does not support partial removal)")

    def trim(self, n_keep: int) -> None:
        """Forget every position >= n_keep of sequence 0."""
        if n_keep < self.n_past:
            self.seq_trim(0, n_keep)

    def reset(self) -> None:
        self._ll.llama_memory_clear(self.mem, True)

    # -- facts ----------------------------------------------------------------------------------------------
    def perf(self) -> dict:
        d = self._ll.llama_perf_context(self.ctx)
        return {"p_eval_ms": d.t_p_eval_ms, "eval_ms": d.t_eval_ms, "n_p_eval": d.n_p_eval, "n_eval": d.n_eval}

    def perf_reset(self) -> None:
        self._ll.llama_perf_context_reset(self.ctx)

    def kv_bytes(self) -> int:
        """KV cache size of the allocated context at its K and V types (llama.cpp logs its own figure, which
        self.memory holds; this one is computed, so the two check each other)."""
        ll = self._ll
        n_layer = ll.llama_model_n_layer(self.model)
        n_head, n_head_kv = ll.llama_model_n_head(self.model), ll.llama_model_n_head_kv(self.model)
        head_dim = ll.llama_model_n_embd(self.model) // max(n_head, 1)
        arch = self.vocab.meta("general.architecture") or ""
        k_len = int(self.vocab.meta(f"{arch}.attention.key_length") or head_dim)
        v_len = int(self.vocab.meta(f"{arch}.attention.value_length") or head_dim)
        rows = self.n_ctx_alloc * n_layer * n_head_kv
        return cache_bytes(self.cfg.cache_k, rows * k_len) + cache_bytes(self.cfg.cache_v, rows * v_len)

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
