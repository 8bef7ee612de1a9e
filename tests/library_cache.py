"""A Hugging Face hub cache layout built on disk for the library's tests.

``models--org--name/{blobs,snapshots/<commit>,refs/<ref>}`` as huggingface_hub
writes it: a blob per content (named by its sha256, so equal files share one),
each snapshot file a relative symlink to its blob.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def tiny_config(model_type: str = "llama", **extra: object) -> bytes:
    """A ``config.json`` of a small Llama-shaped model (mlx-lm knows ``llama``)."""
    config = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
        **extra,
    }
    return json.dumps(config).encode()


def add_revision(
    root: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ()
) -> Path:
    """Add snapshot ``commit`` of ``repo_id`` with ``files`` (name -> content)
    under the hub cache ``root``; each ref in ``refs`` then names it.

    Returns:
        Path: the snapshot folder.
    """
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        if not blob.exists():
            blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def commit_hash(n: int) -> str:
    """A 40-hex-digit commit hash for revision ``n``."""
    return f"{n:040x}"
