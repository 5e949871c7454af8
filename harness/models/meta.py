"""GGUF metadata read with llama.cpp's own gguf reader, without loading weights."""
from __future__ import annotations

from pathlib import Path

from harness.errors import HarnessError
from harness.models.catalog import check_gguf_file


def _value(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def _array_len(reader, key: str) -> int | None:
    f = reader.fields.get(key)
    return None if f is None else len(f.data)


def _reader(path: Path):
    """gguf's reader over a file that parses and whose tensor data all lie inside it."""
    import gguf
    check_gguf_file(path)
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct.error/IndexError on damaged files
        raise HarnessError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); "
                           "it may be truncated") from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in r.tensors), default=0)
    size = path.stat().st_size
    if end > size:
        raise HarnessError(f"{path} is truncated: its tensors need {end} bytes, the file has {size}")
    return r


def check_structure(path: Path) -> None:
    """Refuse a file that does not parse as GGUF or whose tensor data run past its end."""
    _reader(path)


def read_info(path: Path) -> dict:
    import gguf
    r = _reader(path)
    arch = _value(r, "general.architecture")
    ftype = _value(r, "general.file_type")
    try:
        quant = gguf.LlamaFileType(ftype).name.removeprefix("MOSTLY_") if ftype is not None else None
    except ValueError:
        quant = str(ftype)
    return {
        "name": _value(r, "general.name"),
        "arch": arch,
        "layers": _value(r, f"{arch}.block_count"),
        "context_length": _value(r, f"{arch}.context_length"),
        "embedding_length": _value(r, f"{arch}.embedding_length"),
        "vocab_size": _array_len(r, "tokenizer.ggml.tokens"),
        "tokenizer_model": _value(r, "tokenizer.ggml.model"),
        "pre_tokenizer": _value(r, "tokenizer.ggml.pre"),
        "quant": quant,
        "file_type": ftype,
        "tensors": len(r.tensors),
        "bytes": path.stat().st_size,
        "has_chat_template": "tokenizer.chat_template" in r.fields,
    }
