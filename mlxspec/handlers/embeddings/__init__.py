"""``/v1/embeddings``."""
