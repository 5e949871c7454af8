"""Tiny, real llama-architecture GGUF models for tests.

``write_tiny_model`` writes a complete GGUF file (random F32/F16 weights drawn from
``seed``, a few hundred kB) with a small byte-level BPE tokenizer
(``tokenizer.ggml.model = "gpt2"``) that llama.cpp loads, tokenizes with and
decodes in milliseconds on a CPU.

The tokenizer is built deterministically: the 256 byte tokens of GPT-2's
bytes-to-unicode mapping, BPE merges learnt from a small embedded English corpus,
and the control tokens ``<|bos|>``, ``<|eos|>``, ``<|im_start|>``, ``<|im_end|>``.

Variants (``variant=``) differ from the default model in exactly one thing, for
tokenizer-alignment tests of draft/target pairs:

- ``None``: the default tokenizer (``seed`` only changes the weights)
- ``"other_tokenizer"``: a different tokenizer: other corpus, fewer merges, other id
  layout (specials first, bytes in GPT-2 order) and vocab size
- ``"token_text"``: the text of exactly one regular (merged) token differs
- ``"bos_id"``: ``tokenizer.ggml.bos_token_id`` points at ``<|eos|>``
- ``"add_bos"``: ``tokenizer.ggml.add_bos_token`` is flipped (False)
- ``"pre"``: ``tokenizer.ggml.pre`` is ``"gpt-2"`` instead of ``"default"``
- ``"padding"``: ``n_padding`` UNUSED tokens ``<pad_i>`` appended to the vocab; their
  embedding/output rows are zero, all other weights equal the default model's

The output rows of control tokens and of non-printable byte tokens are scaled by 0.1 so that
greedy continuations are mostly printable text (and rarely EOS).

Weights are drawn per tensor from ``numpy.random.default_rng((seed, crc32(name)))``
so the transformer blocks of every variant with the same seed are identical, and
the token tables only depend on the vocabulary size (all variants but
``other_tokenizer``/``padding`` have byte-identical tensors to the default model).

Run ``python tests/tiny_gguf.py OUTDIR`` to write the whole fixture set.
"""

from __future__ import annotations

import re
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = [
    "CHATML_TEMPLATE",
    "FIXTURE_NAMES",
    "VARIANTS",
    "TinyTokenizer",
    "build_tokenizer",
    "bytes_to_unicode",
    "edit_tokenizer",
    "make_fixture_set",
    "write_tiny_model",
]

VARIANTS: tuple[str | None, ...] = (
    None,
    "other_tokenizer",
    "token_text",
    "bos_id",
    "add_bos",
    "pre",
    "padding",
)
FIXTURE_NAMES: tuple[str, ...] = (
    "a",
    "b",
    "other_tokenizer",
    "token_text",
    "bos_id",
    "add_bos",
    "pre",
    "padding",
)

DEFAULT_PRE = "default"
VARIANT_PRE = "gpt-2"  # accepted by llama.cpp for tokenizer.ggml.model == "gpt2"
DEFAULT_N_MERGES = 110
OTHER_N_MERGES = 90
DEFAULT_N_PADDING = 8

SPECIAL_TOKENS: tuple[str, ...] = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# gguf.TokenType values (kept local so the tokenizer helpers need no gguf import)
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_UNUSED = 5

_DEFAULT_CORPUS = """\
hello world, the cat sat on the mat. the cat is a small cat and the dog is a big dog.
hello there! the world is large and the sea is deep. we went to the shop and then
we went home. this is the end of the first part of the story, and it is a good one.
the quick brown fox jumps over the lazy dog. the dog did not see the fox at all.
when the sun comes up in the morning the birds sing and the people wake up to work.
there are many things in the world that we do not know, but we want to learn them.
she said that he would come back in the evening, and he did come back with bread.
they have been waiting for the train for an hour; the train is late again today.
it was the best of times, it was the worst of times, it was the age of wisdom.
in the beginning there was nothing, and then there was something: a word, a world.
hello, hello, hello world. the cat and the hat. the man with the plan and the can.
what is your name? my name is not important. where do you live? i live in the city.
the number of people who read books is going down, but the books are still there.
"""

_OTHER_CORPUS = """\
Speculative decoding lets a small draft model propose tokens that a large target
model verifies in parallel. Accepted tokens are kept; rejected tokens are resampled.
Throughput improves when acceptance rates are high and drafting is cheap. Benchmarks
measure tokens per second, acceptance length, latency, memory, and energy usage.
Quantization reduces memory bandwidth; batching increases arithmetic intensity.
Kernels, caches, schedulers, samplers, and tokenizers all influence performance.
Tokenizers must agree: identical vocabularies keep draft proposals meaningful.
Mismatched vocabularies require translation, retokenization, or heuristic mapping.
"""

# ASCII approximation of GPT-2's pre-tokenizer regex (the corpora are ASCII only).
_PRETOKENIZE_RE = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""
)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping (dict in GPT-2's order)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _encode_word(word: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in word.encode("utf-8"))


@lru_cache(maxsize=8)
def _train_bpe(corpus: str, n_merges: int) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Deterministic greedy BPE on ``corpus``. Returns (merges, new token texts in order)."""
    words = Counter(_encode_word(w) for w in _PRETOKENIZE_RE.findall(corpus))
    splits = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    new_tokens: list[str] = []
    seen: set[str] = set(bytes_to_unicode().values())
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, freq in words.items():
            sym = splits[w]
            for i in range(len(sym) - 1):
                pairs[(sym[i], sym[i + 1])] += freq
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        merged = best[0] + best[1]
        if merged not in seen:
            seen.add(merged)
            new_tokens.append(merged)
        for w, sym in splits.items():
            i = 0
            out: list[str] = []
            while i < len(sym):
                if i < len(sym) - 1 and sym[i] == best[0] and sym[i + 1] == best[1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            splits[w] = out
    if len(merges) < n_merges:
        raise ValueError(f"corpus only supports {len(merges)} merges, {n_merges} requested")
    return tuple(merges), tuple(new_tokens)


@dataclass(frozen=True)
class TinyTokenizer:
    """Everything written under ``tokenizer.*`` (plus the vocab size)."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    add_bos: bool = True
    add_eos: bool = False
    pre: str = DEFAULT_PRE
    model: str = "gpt2"
    chat_template: str | None = CHATML_TEMPLATE
    n_padding: int = 0  # trailing UNUSED padding tokens (their weight rows are zero)
    extras: dict = field(default_factory=dict, compare=False)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def token_id(self, text: str) -> int:
        return self.tokens.index(text)


def _default_tokenizer() -> TinyTokenizer:
    table = bytes_to_unicode()
    merges, merged = _train_bpe(_DEFAULT_CORPUS, DEFAULT_N_MERGES)
    tokens = [table[b] for b in range(256)] + list(merged) + list(SPECIAL_TOKENS)
    types = [TOKEN_NORMAL] * (256 + len(merged)) + [TOKEN_CONTROL] * len(SPECIAL_TOKENS)
    return TinyTokenizer(
        tokens=tuple(tokens),
        token_types=tuple(types),
        merges=tuple(f"{a} {b}" for a, b in merges),
        bos_id=tokens.index("<|bos|>"),
        eos_id=tokens.index("<|eos|>"),
    )


def _other_tokenizer() -> TinyTokenizer:
    merges, merged = _train_bpe(_OTHER_CORPUS, OTHER_N_MERGES)
    tokens = list(SPECIAL_TOKENS) + list(bytes_to_unicode().values()) + list(merged)
    types = [TOKEN_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_NORMAL] * (256 + len(merged))
    return TinyTokenizer(
        tokens=tuple(tokens),
        token_types=tuple(types),
        merges=tuple(f"{a} {b}" for a, b in merges),
        bos_id=tokens.index("<|bos|>"),
        eos_id=tokens.index("<|eos|>"),
    )


def build_tokenizer(variant: str | None = None, *, n_padding: int = DEFAULT_N_PADDING) -> TinyTokenizer:
    """The tokenizer written for ``variant`` (see module docstring)."""
    base = _default_tokenizer()
    if variant is None:
        return base
    if variant == "other_tokenizer":
        return _other_tokenizer()
    if variant == "token_text":
        # the last merged token is a leaf of the merge tree; give it a new, unique text
        idx = 256 + len(_train_bpe(_DEFAULT_CORPUS, DEFAULT_N_MERGES)[1]) - 1
        old = base.tokens[idx]
        new = old + "q"
        while new in base.tokens:
            new += "q"
        tokens = list(base.tokens)
        tokens[idx] = new
        return replace(
            base, tokens=tuple(tokens), extras={"changed_id": idx, "old_text": old, "new_text": new}
        )
    if variant == "bos_id":
        return replace(base, bos_id=base.eos_id)
    if variant == "add_bos":
        return replace(base, add_bos=not base.add_bos)
    if variant == "pre":
        return replace(base, pre=VARIANT_PRE)
    if variant == "padding":
        if n_padding < 1:
            raise ValueError("n_padding must be >= 1")
        return replace(
            base,
            tokens=base.tokens + tuple(f"<pad_{i}>" for i in range(n_padding)),
            token_types=base.token_types + (TOKEN_UNUSED,) * n_padding,
            n_padding=n_padding,
        )
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def edit_tokenizer(tok: TinyTokenizer, token_texts: dict[int, str] | None = None, **fields) -> TinyTokenizer:
    """``tok`` with the text of the ids in ``token_texts`` replaced and its other fields (``bos_id``, ``eos_id``,
    ``add_bos``, ``add_eos``, ``pre``, ``model``: the ``tokenizer.ggml.*`` keys) set from ``fields``."""
    if token_texts:
        tokens = list(tok.tokens)
        for i, text in token_texts.items():
            tokens[i] = text
        tok = replace(tok, tokens=tuple(tokens))
    return replace(tok, **fields) if fields else tok


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng((int(seed), zlib.crc32(name.encode())))


def _tensors(
    tok: TinyTokenizer,
    *,
    seed: int,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    logit_scale: float,
) -> list[tuple[str, np.ndarray, bool]]:
    """(name, array in numpy order, is_matrix). numpy shape is GGUF's ne reversed."""
    head_dim = n_embd // n_head
    n_real = tok.n_vocab - tok.n_padding
    out: list[tuple[str, np.ndarray, bool]] = []

    def normal(name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        return _rng(seed, name).normal(0.0, std, size=shape).astype(np.float32)

    def vocab_table(name: str, std: float) -> np.ndarray:
        w = np.zeros((tok.n_vocab, n_embd), dtype=np.float32)
        w[:n_real] = normal(f"{name}/{n_real}", (n_real, n_embd), std)
        return w

    def norm(name: str) -> np.ndarray:
        return (1.0 + _rng(seed, name).normal(0.0, 0.05, size=(n_embd,))).astype(np.float32)

    out.append(("token_embd.weight", vocab_table("token_embd.weight", 1.0), True))
    for i in range(n_layer):
        p = f"blk.{i}."
        s = 1.0 / np.sqrt(n_embd)
        out += [
            (p + "attn_norm.weight", norm(p + "attn_norm.weight"), False),
            (p + "attn_q.weight", normal(p + "attn_q.weight", (n_head * head_dim, n_embd), s), True),
            (p + "attn_k.weight", normal(p + "attn_k.weight", (n_head_kv * head_dim, n_embd), s), True),
            (p + "attn_v.weight", normal(p + "attn_v.weight", (n_head_kv * head_dim, n_embd), s), True),
            (
                p + "attn_output.weight",
                normal(p + "attn_output.weight", (n_embd, n_head * head_dim), s),
                True,
            ),
            (p + "ffn_norm.weight", norm(p + "ffn_norm.weight"), False),
            (p + "ffn_gate.weight", normal(p + "ffn_gate.weight", (n_ff, n_embd), s), True),
            (p + "ffn_up.weight", normal(p + "ffn_up.weight", (n_ff, n_embd), s), True),
            (p + "ffn_down.weight", normal(p + "ffn_down.weight", (n_embd, n_ff), 1.0 / np.sqrt(n_ff)), True),
        ]
    out.append(("output_norm.weight", norm("output_norm.weight"), False))
    # RMS-normed hidden state has unit RMS, so logits have std ~= logit_scale
    output = vocab_table("output.weight", logit_scale / np.sqrt(n_embd))
    output *= _output_row_scale(tok)[:, None]
    out.append(("output.weight", output, True))
    return out


def _output_row_scale(tok: TinyTokenizer, damp: float = 0.1) -> np.ndarray:
    """Shrink the output rows of control tokens and of tokens holding bytes outside printable
    ASCII/newline, so greedy generations are mostly valid, readable UTF-8 and rarely hit EOS."""
    inv = {c: b for b, c in bytes_to_unicode().items()}
    scale = np.ones(tok.n_vocab, dtype=np.float32)
    for i, (text, ttype) in enumerate(zip(tok.tokens, tok.token_types)):
        if ttype == TOKEN_CONTROL:
            scale[i] = damp
        elif ttype == TOKEN_NORMAL:
            raw = [inv.get(c, 0) for c in text]
            if any(b >= 0x7F or (b < 0x20 and b != 0x0A) for b in raw):
                scale[i] = damp
    return scale


def write_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    variant: str | None = None,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 512,
    dtype: str = "f32",
    n_padding: int = DEFAULT_N_PADDING,
    logit_scale: float = 3.0,
    rms_eps: float = 1e-5,
    rope_freq_base: float = 10000.0,
    chat_template: str | None = CHATML_TEMPLATE,
    name: str | None = None,
    token_texts: dict[int, str] | None = None,
    tokenizer_fields: dict | None = None,
) -> Path:
    """Write a tiny llama-architecture GGUF to ``path`` and return it as a ``Path``.

    ``dtype`` is ``"f32"`` or ``"f16"`` (2-D weights; norm vectors are always F32).
    ``n_padding`` only matters for ``variant="padding"``.
    ``token_texts`` and ``tokenizer_fields`` edit the variant's tokenizer (see ``edit_tokenizer``).
    """
    import gguf  # local import: the tokenizer helpers work without gguf

    if dtype not in ("f32", "f16"):
        raise ValueError("dtype must be 'f32' or 'f16'")
    if n_embd % n_head or n_head % n_head_kv or (n_embd // n_head) % 2:
        raise ValueError("need n_embd % n_head == 0, n_head % n_head_kv == 0 and an even head dim")

    tok = build_tokenizer(variant, n_padding=n_padding)
    if chat_template != tok.chat_template:
        tok = replace(tok, chat_template=chat_template)
    if token_texts or tokenizer_fields:
        tok = edit_tokenizer(tok, token_texts, **(tokenizer_fields or {}))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name or f"tiny-llama-{variant or 'default'}-s{seed}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(rope_freq_base)
    w.add_vocab_size(tok.n_vocab)

    w.add_tokenizer_model(tok.model)
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(list(tok.tokens))
    w.add_token_types(list(tok.token_types))
    w.add_token_merges(list(tok.merges))
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.eos_id)
    w.add_add_bos_token(tok.add_bos)
    w.add_add_eos_token(tok.add_eos)
    if tok.chat_template:
        w.add_chat_template(tok.chat_template)

    for tname, arr, is_matrix in _tensors(
        tok,
        seed=seed,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        logit_scale=logit_scale,
    ):
        if is_matrix and dtype == "f16":
            arr = arr.astype(np.float16)
        w.add_tensor(tname, np.ascontiguousarray(arr))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_fixture_set(dirpath: str | Path, **kwargs) -> dict[str, Path]:
    """Write every fixture into ``dirpath``; returns {name: path} for ``FIXTURE_NAMES``.

    "a" is the default model (seed 0), "b" the default tokenizer with seed 1, and the
    others are the seed-0 variants. Extra ``kwargs`` go to ``write_tiny_model``.
    """
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)
    specs: dict[str, tuple[int, str | None]] = {"a": (0, None), "b": (1, None)}
    specs.update({v: (0, v) for v in VARIANTS if v is not None})
    return {
        key: write_tiny_model(d / f"tiny-{key}.gguf", seed=seed, variant=variant, **kwargs)
        for key, (seed, variant) in specs.items()
    }


if __name__ == "__main__":  # pragma: no cover
    out = make_fixture_set(sys.argv[1] if len(sys.argv) > 1 else "tiny_gguf_fixtures")
    for k, p in out.items():
        print(
            f"{k:16s} {p} {p.stat().st_size} bytes n_vocab={build_tokenizer(None if k in ('a', 'b') else k).n_vocab}"
        )


def write_arch_header(path: Path, name: str, keys: dict | None = None, tensors: dict | None = None) -> Path:
    """A GGUF of architecture `name` (a header that llama.cpp's loader reads; zero tensors that compute nothing)
    with `<name>.KEY` for each of keys (an int, or a list: an array), the default tiny tokenizer, and tensors
    (name -> shape; default one embedding table): for the architecture's facts (harness.models.arch)."""
    import gguf
    w = gguf.GGUFWriter(str(path), name)
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(32)
    for k, v in (keys or {}).items():
        if isinstance(v, list):
            w.add_array(f"{name}.{k}", v)
        else:
            w.add_uint32(f"{name}.{k}", v)
    tok = build_tokenizer()
    w.add_tokenizer_model(tok.model)
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(list(tok.tokens))
    w.add_token_types(list(tok.token_types))
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.eos_id)
    for t, shape in (tensors or {"token_embd.weight": (len(tok.tokens), 32)}).items():
        w.add_tensor(t, np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
