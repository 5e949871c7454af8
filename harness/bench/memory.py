"""Whether each configuration's models fit in memory, checked before anything runs: a worker that runs out of it
is killed mid-unit (or the machine swaps to a crawl and every timing is lost), after the units before it took
their time."""
from __future__ import annotations

from pathlib import Path

from harness.errors import HarnessError
from harness.instance import Instance

GIB = 2**30


def kv_bytes(path: Path, n_ctx: int, cache_k: str, cache_v: str) -> int:
    """A model's KV cache at n_ctx positions and the given cache types (as Engine.kv_bytes computes it), from
    its GGUF metadata through a vocab-only load, which reads no weights. 0 where the metadata has no plain
    figures (per-layer head counts, say): the check then counts the weights alone. From the metadata rather
    than llama_model_n_head & co., which abort the process on a vocab-only model (llama_hparams::n_head)."""
    from harness.engine import cache_bytes
    from harness.llamacpp import Vocab, llama, load_model
    model = load_model(path, vocab_only=True)
    try:
        v = Vocab(model)
        arch = v.meta("general.architecture") or ""
        layers, heads, embd = (_int(v.meta(f"{arch}.{k}")) for k in ("block_count", "attention.head_count",
                                                                      "embedding_length"))
        kv_heads = _int(v.meta(f"{arch}.attention.head_count_kv")) or heads
        if not (layers and heads and embd and kv_heads):
            return 0
        k_len = _int(v.meta(f"{arch}.attention.key_length")) or embd // heads
        v_len = _int(v.meta(f"{arch}.attention.value_length")) or embd // heads
    finally:
        llama().llama_model_free(model)
    rows = n_ctx * layers * kv_heads
    return cache_bytes(cache_k, rows * k_len) + cache_bytes(cache_v, rows * v_len)


def _int(s: str | None) -> int | None:
    return int(s) if s and s.isdigit() else None


def available_bytes() -> int:
    """Memory the system can give without swapping. The page cache it could drop counts as available; a model
    file already in it is then counted too, which is right: running the model keeps those pages in use."""
    import psutil
    return psutil.virtual_memory().available


def check_memory(instances: list[Instance], n_ctx: int) -> None:
    """Refuse, in one line, a configuration whose target and draft (weights plus KV caches) need more memory
    than is available. Only configurations entirely on the CPU (ngl and ngl_draft 0) are checked: with offload
    the host's share depends on the layers offloaded and the backend, which llama.cpp alone knows."""
    from harness.models.catalog import load_catalog, resolve
    cat = load_catalog()
    sizes: dict[tuple, tuple[int, int]] = {}  # (model, K type, V type) -> (weights, KV cache) bytes

    def size(ref: str, k: str, v: str) -> tuple[int, int]:
        if (ref, k, v) not in sizes:
            path = resolve(ref, cat).path
            sizes[(ref, k, v)] = (path.stat().st_size, kv_bytes(path, n_ctx, k, v))
        return sizes[(ref, k, v)]

    avail = None
    for i in instances:
        if i.ngl or i.ngl_draft:
            continue
        models = [(i.target, i.cache_k, i.cache_v)]
        if i.draft.model:
            models.append((i.draft.model, i.cache_k_draft, i.cache_v_draft))
        need = sum(sum(size(*m)) for m in models)
        avail = available_bytes() if avail is None else avail
        if need > avail:
            big = max(models, key=lambda m: size(*m)[0])
            weights, kv = size(*big)
            pair = "".join(f", with its {'target' if o is models[0] else 'draft'} {o[0]}'s ({_gib(sum(size(*o)))}),"
                           for o in models if o is not big)
            raise HarnessError(
                f"{big[0]} does not fit in memory: its weights ({_gib(weights)}) and KV cache at --n-ctx {n_ctx} "
                f"({_gib(kv)}){pair} need {_gib(need)}, and {_gib(avail)} is available: pick a smaller "
                f"quantization{_smaller(big[0], cat, avail - (need - weights))}, lower --n-ctx, or offload layers to a "
                "GPU with --ngl/--ngl-draft")


def _smaller(ref: str, cat: dict, room: int) -> str:
    """', e.g. NAME (SIZE)': the largest catalog quantization of the same model whose weights fit in `room`
    bytes (its name the same but for the quantization), or '' where none does."""
    stem = ref.rsplit("-", 1)[0]
    fits = []
    for m in cat.values():
        size = m.path.stat().st_size if m.path.exists() else m.bytes
        if m.name != ref and m.name.rsplit("-", 1)[0] == stem and size and size <= room:
            fits.append((size, m.name))
    if not fits:
        return ""
    size, name = max(fits)
    return f", e.g. {name} ({_gib(size)})"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"
