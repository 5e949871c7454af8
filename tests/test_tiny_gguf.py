"""Tests for the tiny GGUF fixtures in tests/tiny_gguf.py.

The writer/metadata tests only need ``gguf``; the loading tests need ``llama_cpp``
(skipped when it is not installed) and run on the CPU in well under a second.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from tests.tiny_gguf import (
    CHATML_TEMPLATE,
    FIXTURE_NAMES,
    VARIANT_PRE,
    build_tokenizer,
    make_fixture_set,
    write_tiny_model,
)

gguf = pytest.importorskip("gguf")

TEXT = "hello world, the cat"
EXPECTED_VOCAB = {
    "a": 370,
    "b": 370,
    "other_tokenizer": 350,
    "token_text": 370,
    "bos_id": 370,
    "add_bos": 370,
    "pre": 370,
    "padding": 378,
}
VARIANT_OF = {"a": None, "b": None, **{k: k for k in FIXTURE_NAMES if k not in ("a", "b")}}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    return make_fixture_set(tmp_path_factory.mktemp("tiny_gguf"))


def _read(path: Path):
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    return meta, tensors


TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.chat_template",
    "llama.vocab_size",
)


# --------------------------------------------------------------------------- writer


def test_fixture_set_written(fixtures):
    assert set(fixtures) == set(FIXTURE_NAMES)
    for name, path in fixtures.items():
        assert path.is_file()
        assert 0 < path.stat().st_size < 4 * 2**20, name
        meta, tensors = _read(path)
        assert meta["general.architecture"] == "llama"
        assert meta["general.file_type"] == 0
        assert meta["llama.vocab_size"] == EXPECTED_VOCAB[name] == len(meta["tokenizer.ggml.tokens"])
        assert build_tokenizer(VARIANT_OF[name]).n_vocab == EXPECTED_VOCAB[name]
        assert tensors["token_embd.weight"].shape == (EXPECTED_VOCAB[name], 64)
        assert tensors["output.weight"].shape == (EXPECTED_VOCAB[name], 64)
        assert meta["tokenizer.chat_template"] == CHATML_TEMPLATE
        # 2 blocks x 9 tensors + token_embd + output_norm + output
        assert len(tensors) == 21


def test_each_variant_differs_in_exactly_one_thing(fixtures):
    base, base_t = _read(fixtures["a"])
    expected_diff = {
        "b": set(),
        "other_tokenizer": None,  # a different tokenizer altogether
        "token_text": {"tokenizer.ggml.tokens"},
        "bos_id": {"tokenizer.ggml.bos_token_id"},
        "add_bos": {"tokenizer.ggml.add_bos_token"},
        "pre": {"tokenizer.ggml.pre"},
        "padding": {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "llama.vocab_size"},
    }
    for name, want in expected_diff.items():
        meta, tensors = _read(fixtures[name])
        diff = {k for k in TOKENIZER_KEYS if meta.get(k) != base.get(k)}
        if want is None:
            assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "llama.vocab_size"} <= diff
            assert meta["tokenizer.ggml.pre"] == base["tokenizer.ggml.pre"]
            assert meta["tokenizer.ggml.add_bos_token"] == base["tokenizer.ggml.add_bos_token"]
            # same ids, different texts
            n = min(meta["llama.vocab_size"], base["llama.vocab_size"])
            same = sum(
                a == b for a, b in zip(meta["tokenizer.ggml.tokens"][:n], base["tokenizer.ggml.tokens"][:n])
            )
            assert same < n // 10
        else:
            assert diff == want, name
        # weights: b has new ones, everything but other_tokenizer/padding shares a's tensors
        if name == "b":
            assert not np.array_equal(tensors["blk.0.attn_q.weight"], base_t["blk.0.attn_q.weight"])
            assert not np.array_equal(tensors["token_embd.weight"], base_t["token_embd.weight"])
        elif name in ("token_text", "bos_id", "add_bos", "pre"):
            assert all(np.array_equal(tensors[k], base_t[k]) for k in base_t)

    text_a = base["tokenizer.ggml.tokens"]
    text_t = _read(fixtures["token_text"])[0]["tokenizer.ggml.tokens"]
    changed = [i for i, (x, y) in enumerate(zip(text_a, text_t)) if x != y]
    assert len(changed) == 1 and build_tokenizer("token_text").extras["changed_id"] == changed[0]
    assert build_tokenizer("token_text").token_types[changed[0]] == gguf.TokenType.NORMAL

    assert _read(fixtures["pre"])[0]["tokenizer.ggml.pre"] == VARIANT_PRE != base["tokenizer.ggml.pre"]
    assert _read(fixtures["add_bos"])[0]["tokenizer.ggml.add_bos_token"] is False


def test_padding_variant_extends_vocab(fixtures):
    base, base_t = _read(fixtures["a"])
    meta, tensors = _read(fixtures["padding"])
    n = base["llama.vocab_size"]
    assert meta["tokenizer.ggml.tokens"][:n] == base["tokenizer.ggml.tokens"]
    assert meta["tokenizer.ggml.tokens"][n:] == [f"<pad_{i}>" for i in range(8)]
    assert meta["tokenizer.ggml.token_type"][n:] == [gguf.TokenType.UNUSED] * 8
    for k in ("token_embd.weight", "output.weight"):
        np.testing.assert_array_equal(tensors[k][:n], base_t[k])
        assert not tensors[k][n:].any()
    for k in base_t:
        if k not in ("token_embd.weight", "output.weight"):
            np.testing.assert_array_equal(tensors[k], base_t[k])


def test_writer_is_deterministic_and_f16(tmp_path):
    p1 = write_tiny_model(tmp_path / "x.gguf", seed=3)
    p2 = write_tiny_model(tmp_path / "y.gguf", seed=3)
    assert p1.read_bytes()[-100_000:] == p2.read_bytes()[-100_000:]
    p3 = write_tiny_model(tmp_path / "h.gguf", seed=3, dtype="f16", n_layer=1, variant="padding", n_padding=3)
    meta, tensors = _read(p3)
    assert meta["general.file_type"] == 1 and meta["llama.block_count"] == 1
    assert tensors["blk.0.attn_q.weight"].dtype == np.float16
    assert tensors["blk.0.attn_norm.weight"].dtype == np.float32
    assert meta["llama.vocab_size"] == 373
    with pytest.raises(ValueError):
        write_tiny_model(tmp_path / "bad.gguf", variant="nope")


# --------------------------------------------------------------------------- llama.cpp


@pytest.fixture(scope="module")
def llama(fixtures):
    llama_cpp = pytest.importorskip("llama_cpp")
    llama_cpp.llama_backend_init()
    return llama_cpp


class _Model:
    def __init__(self, lc, path: Path, *, vocab_only: bool = False):
        self.lc = lc
        params = lc.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"llama.cpp failed to load {path}"
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.ctx = None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode()
        buf = (self.lc.llama_token * (len(data) + 8))()
        n = self.lc.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        assert n >= 0
        return list(buf[:n])

    def detokenize(self, ids: list[int]) -> str:
        arr = (self.lc.llama_token * len(ids))(*ids)
        out = ctypes.create_string_buffer(4096)
        n = self.lc.llama_detokenize(self.vocab, arr, len(ids), out, len(out), True, False)
        assert n >= 0
        return out.raw[:n].decode()

    def piece(self, tok: int) -> bytes:
        out = ctypes.create_string_buffer(64)
        n = self.lc.llama_token_to_piece(self.vocab, tok, out, len(out), 0, False)
        return out.raw[:n]

    def logits(self, ids: list[int]) -> np.ndarray:
        """Fresh context, decode ``ids`` as one batch, return logits of every position."""
        lc = self.lc
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = 256
        cparams.n_batch = 256
        cparams.n_ubatch = 256
        cparams.n_threads = cparams.n_threads_batch = 2
        cparams.no_perf = True
        ctx = lc.llama_init_from_model(self.model, cparams)
        assert ctx
        try:
            n_vocab = lc.llama_vocab_n_tokens(self.vocab)
            batch = lc.llama_batch_init(len(ids), 0, 1)
            try:
                batch.n_tokens = len(ids)
                for i, t in enumerate(ids):
                    batch.token[i] = t
                    batch.pos[i] = i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = True
                assert lc.llama_decode(ctx, batch) == 0
                return np.array(
                    [
                        np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                        for i in range(len(ids))
                    ]
                )
            finally:
                lc.llama_batch_free(batch)
        finally:
            lc.llama_free(ctx)

    def close(self):
        if self.model:
            self.lc.llama_model_free(self.model)
            self.model = None


@pytest.fixture(scope="module")
def model_a(llama, fixtures):
    m = _Model(llama, fixtures["a"])
    yield m
    m.close()


def test_load_and_tokenize_default(llama, model_a):
    lc, tok = llama, build_tokenizer()
    assert lc.llama_vocab_n_tokens(model_a.vocab) == tok.n_vocab == 370
    assert lc.llama_vocab_bos(model_a.vocab) == tok.bos_id
    assert lc.llama_vocab_eos(model_a.vocab) == tok.eos_id
    assert lc.llama_vocab_get_add_bos(model_a.vocab) is True

    ids = model_a.tokenize(TEXT)
    assert ids[0] == tok.bos_id
    body = ids[1:]
    # words become multi-byte tokens: "hello", " world", ",", " the", " cat"
    assert [model_a.piece(t) for t in body] == [b"hello", b" world", b",", b" the", b" cat"]
    assert [tok.tokens[t] for t in body] == ["hello", "Ġworld", ",", "Ġthe", "Ġcat"]
    assert model_a.detokenize(ids) == TEXT
    assert model_a.detokenize(model_a.tokenize(TEXT, add_special=False)) == TEXT
    # arbitrary bytes round-trip through the byte tokens
    odd = "Zebra 42 ünïcödé\n\ttabs  "
    assert model_a.detokenize(model_a.tokenize(odd, add_special=False)) == odd


def test_decode_is_finite_deterministic_and_nondegenerate(llama, model_a, fixtures):
    ids = model_a.tokenize(TEXT)
    l1 = model_a.logits(ids)
    l2 = model_a.logits(ids)
    assert l1.shape == (len(ids), 370)
    assert np.isfinite(l1).all()
    np.testing.assert_array_equal(l1, l2)
    assert l1.std() > 0.5
    # greedy predictions vary with the input
    assert len(set(l1.argmax(axis=1).tolist())) >= 3
    other = model_a.logits(model_a.tokenize("the dog is a big dog"))
    assert other[-1].argmax() != l1[-1].argmax() or not np.allclose(other[-1], l1[-1])

    # seed 1: same tokenizer, different weights -> different logits
    mb = _Model(llama, fixtures["b"])
    try:
        assert mb.tokenize(TEXT) == ids
        assert not np.allclose(mb.logits(ids), l1)
    finally:
        mb.close()

    # padding variant: identical logits on the shared ids, zero logits for the pads
    mp = _Model(llama, fixtures["padding"])
    try:
        lp = mp.logits(ids)
        assert lp.shape == (len(ids), 378)
        np.testing.assert_allclose(lp[:, :370], l1, rtol=1e-4, atol=1e-4)
        assert not lp[:, 370:].any()
    finally:
        mp.close()


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_vocab_only_load_every_variant(llama, fixtures, name):
    lc = llama
    tok = build_tokenizer(VARIANT_OF[name])
    m = _Model(lc, fixtures[name], vocab_only=True)
    try:
        v = m.vocab
        assert lc.llama_vocab_n_tokens(v) == EXPECTED_VOCAB[name]
        assert lc.llama_vocab_bos(v) == tok.bos_id
        assert lc.llama_vocab_eos(v) == tok.eos_id
        assert lc.llama_vocab_get_add_bos(v) is tok.add_bos
        for i in (0, 100, tok.n_vocab - 1, tok.bos_id):
            assert lc.llama_vocab_get_text(v, i).decode() == tok.tokens[i]
        ids = m.tokenize(TEXT)
        assert (ids[0] == tok.bos_id) is tok.add_bos
        assert m.detokenize(ids) == TEXT
        if name == "token_text":
            ex = tok.extras
            assert lc.llama_vocab_get_text(v, ex["changed_id"]).decode() == ex["new_text"]
        default = build_tokenizer()
        default_ids = [default.bos_id] + [
            default.token_id(t) for t in ("hello", "Ġworld", ",", "Ġthe", "Ġcat")
        ]
        if name == "other_tokenizer":
            assert ids != default_ids
        elif name == "add_bos":
            assert ids == default_ids[1:]
        elif name == "bos_id":
            assert ids == [tok.bos_id] + default_ids[1:]
        else:
            assert ids == default_ids
    finally:
        m.close()
