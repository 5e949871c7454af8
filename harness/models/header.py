"""GGUF headers read fast: the key-value section and the tensor list, with struct from a memory map, so that no
tensor data is touched (a 100 GB file reads as fast as a 100 MB one), and checked against the file's size. gguf's
GGUFReader builds numpy views of every field and array item: 6.4 s for the header of the F16 Qwen2.5-Coder 1.5B on
a 2-core VM, where this takes 0.05 s; gguf supplies the tensor types' sizes.

`vocab` derives from a header what llama.cpp's vocabulary would hold (llama_vocab::impl::load in
src/llama-vocab.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors): its type, BOS and EOS ids, add-BOS and
add-EOS flags, size and token texts, with llama.cpp's defaults where the header leaves a key out. The tensor list
gives the parameter count, and the routed experts' share of it per layer (arch.py)."""
from __future__ import annotations

import hashlib
import mmap
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from harness.models.catalog import GGUF_MAGIC

NULL = -1  # LLAMA_TOKEN_NULL
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_TOKENS = "tokenizer.ggml.tokens"
GGML_MAX_DIMS = 4
LLAMA_MAX_LAYERS = 512  # a model's numeric array this short may hold per-layer values (expert_used_count): kept
MAX_NESTING = 16  # arrays inside arrays: read recursively, refused deeper than this
_EXPERTS = re.compile(rb"blk\.(\d+)\.ffn_\w+_exps\.")  # the routed experts' tensors (llama-arch.cpp: *_exps)


class Unreadable(Exception):
    """A file that is no GGUF this llama.cpp could load as a model; `kind` groups the skipped files in the output."""

    def __init__(self, kind: str, why: str):
        super().__init__(why)
        self.kind = kind


class _Short(Exception):
    pass


@dataclass
class Header:
    path: Path
    bytes: int  # the file's size (a split model's: all its parts)
    kv: dict  # scalars and strings; an array is its length
    tokens: list[bytes] | None  # tokenizer.ggml.tokens, as stored
    tokenizer_digest: str  # of every tokenizer.* key-value as stored: equal digests, equal tokenizers
    arrays: dict = field(default_factory=dict)  # numeric arrays of at most LLAMA_MAX_LAYERS items, as lists (but the
    # tokenizer's)
    params: int = 0  # elements of every tensor
    expert_params: dict = field(default_factory=dict)  # layer -> elements of its routed experts' tensors


class _Reader:
    def __init__(self, buf, endian: str):
        self.buf, self.e, self.pos, self.size = buf, endian, 0, len(buf)
        self.numbers: list | None = None  # the values of the last short numeric array read
        self.depth = 0  # arrays of arrays being read, one inside the other

    def take(self, fmt: str):
        s = struct.Struct(self.e + fmt)
        if self.pos + s.size > self.size:
            raise _Short
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Short
        self.pos += n

    def string(self) -> bytes:
        n = self.take("Q")
        if self.pos + n > self.size:
            raise _Short
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def strings(self, count: int, keep: bool) -> list[bytes] | None:
        """An array of strings: the tight loop that dominates a header's reading (150k tokens, 150k merges)."""
        buf, pos, size = self.buf, self.pos, self.size
        if count * 8 > size - pos:  # every string takes its 8-byte length at least
            raise _Short
        unpack = struct.Struct(self.e + "Q").unpack_from
        out: list[bytes] | None = [] if keep else None
        try:
            if keep:
                for _ in range(count):
                    (n,) = unpack(buf, pos)
                    out.append(buf[pos + 8:pos + 8 + n])
                    pos += 8 + n
            else:
                for _ in range(count):
                    pos += 8 + unpack(buf, pos)[0]
        except struct.error:
            raise _Short from None
        if pos > size:
            raise _Short
        self.pos = pos
        return out

    def value(self, t: int, keep: bool = False):
        if t in _SCALAR:
            return self.take(_SCALAR[t])
        if t == _STRING:
            return self.string().decode("utf-8", errors="replace")
        if t == _ARRAY:
            it, n = self.take("I"), self.take("Q")
            if it == _STRING:
                got = self.strings(n, keep)
                return got if keep else n
            if it in _SCALAR:
                start = self.pos
                self.skip(n * struct.calcsize(_SCALAR[it]))
                if n <= LLAMA_MAX_LAYERS:
                    self.numbers = list(struct.unpack_from(f"{self.e}{n}{_SCALAR[it]}", self.buf, start))
            elif it == _ARRAY:
                self.depth += 1
                if self.depth > MAX_NESTING:
                    raise Unreadable("unreadable", f"arrays nested more than {MAX_NESTING} deep, which no model "
                                                   "holds: a damaged or hostile file")
                for _ in range(n):
                    self.value(_ARRAY)
                self.depth -= 1
                self.numbers = None
            else:
                raise Unreadable("unreadable", f"an array of unknown GGUF type {it}")
            return n
        raise Unreadable("unreadable", f"a value of unknown GGUF type {t}")


def _type_sizes() -> dict[int, tuple[int, int]]:
    from gguf.constants import GGML_QUANT_SIZES
    return {int(k): v for k, v in GGML_QUANT_SIZES.items()}


def read_header(path: Path, total_bytes: int | None = None) -> Header:
    """The key-value section and tensor list of a GGUF file, checked against its size; raises Unreadable."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block the open, a folder fail it
            raise Unreadable("not a file", "not a regular file (a folder, FIFO or device): give a GGUF file")
        size = st.st_size
        with open(path, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise Unreadable("not GGUF", f"not a GGUF file (magic bytes {magic!r}, expected b'GGUF')")
            if size < 24:
                raise Unreadable("truncated", f"truncated header: the file has {size} bytes")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(path, mm, size, total_bytes or size)
    except OSError as e:
        raise Unreadable("unreadable", f"cannot read it: {e.strerror or e}") from None


def _parse(path: Path, mm, size: int, total_bytes: int) -> Header:
    (version,) = struct.unpack_from("<I", mm, 4)
    if version & 0xFFFF == 0 and version != 0:
        raise Unreadable("unsupported", "a big-endian GGUF, which llama.cpp does not load on this machine")
    if version not in (2, 3):
        raise Unreadable("unsupported", f"GGUF version {version}, which llama.cpp does not load (it reads 2 and 3)")
    r = _Reader(mm, "<")
    r.pos = 8
    kv: dict = {}
    arrays: dict = {}
    tokens = None
    digest = hashlib.blake2b(digest_size=16)
    try:
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        if n_kv * 12 + n_tensors * 24 > size:  # the least a key-value and a tensor's entry take
            raise _Short
        for _ in range(n_kv):
            start = r.pos
            key = r.string().decode("utf-8", errors="replace")
            t = r.take("I")
            r.numbers = None
            v = r.value(t, keep=key == _TOKENS and t == _ARRAY)
            if r.numbers is not None and not key.startswith("tokenizer."):
                arrays[key] = r.numbers
            if key == _TOKENS and isinstance(v, list):
                tokens, v = v, len(v)
            kv[key] = v
            if key.startswith("tokenizer."):
                digest.update(mm[start:r.pos])
        end, params, experts = _tensors(r, n_tensors, kv)
    except _Short:
        raise Unreadable("truncated", f"truncated header: it ends at byte {size}, inside its metadata") from None
    if end > size:
        raise Unreadable("truncated", f"truncated: its tensors need {end} bytes, the file has {size}")
    return Header(path, total_bytes, kv, tokens, digest.hexdigest(), arrays, params, experts)


def _tensors(r: _Reader, n_tensors: int, kv: dict) -> tuple[int, int, dict[int, int]]:
    """The byte where the last tensor's data ends (the tensor list is read; the data is not), the elements of all
    tensors, and those of each layer's routed experts."""
    sizes = _type_sizes()
    last = params = 0
    experts: dict[int, int] = {}
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("I")
        if n_dims > GGML_MAX_DIMS:
            raise Unreadable("unreadable", f"a tensor with {n_dims} dimensions")
        n = 1
        for _ in range(n_dims):
            n *= r.take("Q")
        ttype, offset = r.take("I"), r.take("Q")
        params += n
        if m := _EXPERTS.match(name):
            experts[int(m[1])] = experts.get(int(m[1]), 0) + n
        if ttype in sizes:
            block, type_size = sizes[ttype]
            last = max(last, offset + n // block * type_size)
    align = kv.get("general.alignment", 32)
    align = align if isinstance(align, int) and align > 0 else 32
    return -(-r.pos // align) * align + last, params, experts


def require_model(h: Header) -> None:
    """Unreadable where llama.cpp's loader would refuse the file as a model: no general.architecture (it names the
    keys every other is read under) or no tensors (a vocabulary-only GGUF)."""
    if not isinstance(h.kv.get("general.architecture"), str):
        raise Unreadable("not a model", "no general.architecture key, which llama.cpp needs to load it")
    if not h.params:
        raise Unreadable("not a model", "no tensors (a vocabulary-only GGUF): llama.cpp loads no model from it")


# -- llama.cpp's vocabulary, as llama-vocab.cpp derives it from the header --------------------------------------
VOCAB_TYPES = {"no_vocab": "NONE", "none": "NONE", "llama": "SPM", "bert": "WPM", "gpt2": "BPE", "hybriddna": "BPE",
               "whitespace": "BPE", "gemma4": "BPE", "t5": "UGM", "rwkv": "RWKV", "test": "TEST", "plamo2": "PLAMO2"}
# default BOS and EOS ids per vocab type, before the header's own keys
_DEFAULT_IDS = {"SPM": (1, 2), "WPM": (101, NULL), "BPE": (11, 11), "UGM": (NULL, 1), "RWKV": (NULL, NULL),
                "TEST": (NULL, NULL), "PLAMO2": (1, 2), "NONE": (NULL, NULL)}
_DEFAULT_ADD = {"SPM": (True, False), "WPM": (True, False), "UGM": (False, True), "RWKV": (False, False)}
# BPE pre-tokenizers that turn add-BOS on, and those that have no BOS (before the header's keys)
_ADD_BOS_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                "jina-v5-nano", "tekken", "chameleon"}
_NO_BOS_PRE = {"chatglm-bpe", "glm4", "glm5"}
_GEMMA4_PRE = {"gemma4", "granite-embed-multi-311m"}  # add-BOS forced on after the header's keys


@dataclass
class Vocab:
    type: str
    model: str
    pre: str | None
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool
    texts: list[bytes] = field(repr=False)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("type", "model", "pre", "n_tokens", "bos", "eos", "add_bos", "add_eos")}


def vocab(h: Header) -> Vocab:
    """The fields common_speculative_are_compatible reads, as llama_vocab::impl::load sets them; raises Unreadable
    where llama.cpp would not load the vocabulary at all."""
    kv = h.kv
    model = kv.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        what = kv.get("general.type") or kv.get("general.architecture") or "GGUF"
        raise Unreadable("no vocabulary", f"no vocabulary (tokenizer.ggml.model is missing; general.type or "
                                          f"architecture: {what})")
    vtype = VOCAB_TYPES.get(model)
    if vtype is None:
        raise Unreadable("unknown tokenizer", f"tokenizer '{model}', which this llama.cpp does not know")
    pre = kv.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) else None
    if model == "gemma4":
        pre = "gemma4"
    if vtype == "NONE":  # returns before reading tokens or special ids: dummy tokens, no BOS/EOS
        n = kv.get(f"{kv.get('general.architecture')}.vocab_size")
        n = n if isinstance(n, int) else 0
        return Vocab(vtype, model, pre, n, NULL, NULL, False, False, [b""] * n)
    if h.tokens is None:
        raise Unreadable("no vocabulary", "no token list (tokenizer.ggml.tokens)")
    texts = [t or b"[EMPTY_%d]" % i for i, t in enumerate(h.tokens)] if not all(h.tokens) else h.tokens
    n = len(texts)
    bos, eos = (NULL, NULL) if model == "gemma4" else _DEFAULT_IDS[vtype]
    add_bos, add_eos = _DEFAULT_ADD.get(vtype, (False, False))
    if vtype == "BPE":
        add_bos = add_bos or (pre or "") in _ADD_BOS_PRE
        bos = NULL if (pre or "") in _NO_BOS_PRE else bos
    ids = []
    for key, default in (("tokenizer.ggml.bos_token_id", bos), ("tokenizer.ggml.eos_token_id", eos)):
        tid = NULL if default >= n else default  # a default out of the vocabulary is disabled
        given = kv.get(key)
        if isinstance(given, int) and not isinstance(given, bool) and 0 <= given < n:
            tid = given  # a key out of range keeps the default
        ids.append(tid)
    flags = []
    for key, default in (("tokenizer.ggml.add_bos_token", add_bos), ("tokenizer.ggml.add_eos_token", add_eos)):
        given = kv.get(key)
        flags.append(given if isinstance(given, bool) else default)
    if vtype == "BPE" and pre in _GEMMA4_PRE:
        flags[0] = True
    return Vocab(vtype, model, pre, n, ids[0], ids[1], flags[0], flags[1], texts)
