"""Speculative-decoding benchmark harness for GGUF models."""

__version__ = "0.1.0"
