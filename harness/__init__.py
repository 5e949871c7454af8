"""Speculative-decoding benchmark harness for GGUF models."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`from harness import GGUFDraft` (ggufdraft), without loading llama.cpp on every import of the harness."""
    if name == "GGUFDraft":
        from harness.ggufdraft import GGUFDraft
        return GGUFDraft
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
