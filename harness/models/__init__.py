"""Model catalog: sources, fetch, verification, derived quantizations, GGUF metadata."""
