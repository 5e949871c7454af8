"""The run's prompt cache: each model evaluates each prompt once a run, with given engine settings; later uses
restore sequence 0's KV state from a file. Speed figures leave the prompt's evaluation out, so a restore changes
none of them; a latency, which includes it, is not measured where a prompt was restored (generate records None).
evaluate_prompt, timed and teacher_forced drive an engine through it: this module sits above harness.engine.

A file is llama.cpp's sequence state (llama_state_seq_get_data) in a container of our own: a magic, a digest of
what follows, the token count and tokens, the state. llama.cpp's own state files are not used: it aborts the
process on a truncated one (GGML_ASSERT in state_seq_load_file) instead of refusing it."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from harness.llamacpp import llama

MAGIC = b"HKVSEQ01"
_HEAD = len(MAGIC) + 16  # the magic and a 16-byte digest of the rest


class PromptCache:
    """Files named by a hash of everything the KV values depend on: the model file (path, size, mtime), every
    engine setting (those that change the numerics and, to be safe, the rest), llama.cpp's build and the tokens.
    A file that fails to load (corrupt, cut short, refused by llama.cpp) is evaluated afresh and overwritten;
    `rejected` counts those, `unsaved` the states that could not be written."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.restored = self.evaluated = self.rejected = self.unsaved = 0
        self.save_ms = 0.0  # time spent writing files, which no timing counts (timed())

    def counts(self) -> dict:
        return {"restored": self.restored, "evaluated": self.evaluated, "rejected": self.rejected,
                "unsaved": self.unsaved}

    def path(self, engine, tokens: list[int]) -> Path:
        ll = llama()
        st = engine.path.stat()
        what = {"model": [str(engine.path.resolve()), st.st_size, st.st_mtime_ns],
                "engine": asdict(engine.cfg) | {"threads": engine.cfg.resolved_threads()},
                "llama.cpp": [ll.__version__, ll.llama_print_system_info().decode(errors="replace")]}
        h = hashlib.sha256(json.dumps(what, sort_keys=True).encode())
        h.update(np.asarray(tokens, dtype="<i4").tobytes())
        return self.dir / f"{h.hexdigest()[:40]}.kv"

    def evaluate(self, engine, tokens: list[int], seq: int = 0) -> bool:
        """tokens into the engine's empty sequence seq: restored where a file holds them, else decoded (no logits)
        and saved. True when restored. A file holds one sequence's state, restored into any."""
        path = self.path(engine, tokens)
        if path.exists():
            if self._load(engine, tokens, path, seq):
                self.restored += 1
                return True
            self.rejected += 1
            engine.seq_trim(seq, 0)  # whatever a failed load left
        engine.prefill(tokens, seq)
        self.evaluated += 1
        t = time.perf_counter()
        self._save(engine, tokens, path, seq)
        self.save_ms += (time.perf_counter() - t) * 1e3
        return False

    def _load(self, engine, tokens: list[int], path: Path, seq: int) -> bool:
        ll = llama()
        try:
            data = bytearray(path.stat().st_size)
            with open(path, "rb") as f:
                if f.readinto(data) != len(data):
                    return False
        except OSError:
            return False
        if len(data) < _HEAD + 4 or data[:len(MAGIC)] != MAGIC or \
                hashlib.blake2b(memoryview(data)[_HEAD:], digest_size=16).digest() != data[len(MAGIC):_HEAD]:
            return False
        n = int.from_bytes(data[_HEAD:_HEAD + 4], "little")
        start = _HEAD + 4 + 4 * n
        if n != len(tokens) or start > len(data) or \
                np.frombuffer(data, dtype="<i4", count=n, offset=_HEAD + 4).tolist() != list(tokens):
            return False
        size = len(data) - start
        state = (ctypes.c_uint8 * size).from_buffer(data, start)
        if not ll.llama_state_seq_set_data(engine.ctx, state, size, seq) or \
                ll.llama_memory_seq_pos_max(engine.mem, seq) != n - 1:
            return False
        return True

    def _save(self, engine, tokens: list[int], path: Path, seq: int) -> None:
        """Written under a temporary name, then renamed: a concurrent or interrupted writer leaves no half file
        under the real one (and the digest catches one that a crash of the machine left)."""
        ll = llama()
        size = ll.llama_state_seq_get_size(engine.ctx, seq)
        state = (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data(engine.ctx, state, size, seq) != size:
            self.unsaved += 1
            return
        body = [len(tokens).to_bytes(4, "little"), np.asarray(tokens, dtype="<i4").tobytes(), memoryview(state)]
        digest = hashlib.blake2b(digest_size=16)
        for b in body:
            digest.update(b)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                for b in (MAGIC, digest.digest(), *body):
                    f.write(b)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            self.unsaved += 1

    def tally(self) -> tuple[int, float]:
        return self.restored, self.save_ms


def evaluate_prompt(engine, tokens: list[int], cache: PromptCache | None = None, seq: int = 0) -> bool:
    """tokens into the engine's empty sequence seq, no logits: through the cache where there is one. True when
    restored."""
    if cache is None or not tokens:
        engine.prefill(tokens, seq)
        return False
    return cache.evaluate(engine, tokens, seq)


def timed(cache: PromptCache | None, work) -> float | None:
    """The ms work() took, less the cache's file writes in it; None where it restored a prompt: what it took then
    is no evaluation's time."""
    n0, s0 = cache.tally() if cache else (0, 0.0)
    t = time.perf_counter()
    work()
    ms = (time.perf_counter() - t) * 1e3
    n1, s1 = cache.tally() if cache else (0, 0.0)
    return None if n1 > n0 else ms - (s1 - s0)


def teacher_forced(engine, prompt_tokens: list[int], output: list[int], cache: PromptCache | None = None) -> np.ndarray:
    """Logits [len(output), n_vocab] predicting each output token, from one batched pass over the prompt and
    output (chunks of n_batch): row j comes from the position of the token before output[j]. cache: the run's
    prompt cache, for the prompt but its last token."""
    engine.reset()
    if not output:
        return np.zeros((0, engine.n_vocab), dtype=np.float32)
    evaluate_prompt(engine, prompt_tokens[:-1], cache)
    block = [prompt_tokens[-1], *output[:-1]]
    out = np.empty((len(block), engine.n_vocab), dtype=np.float32)
    nb = engine.cfg.n_batch
    for s in range(0, len(block), nb):
        chunk = block[s:s + nb]
        out[s:s + len(chunk)] = engine.decode(chunk, logits="all")  # copy: the view dies at the next decode
    return out
