"""Hugging Face model search, filtered to MLX, with an explicit offline state.

``HfApi.list_models(search=q, filter="mlx")``: the ``mlx`` library tag, so every
result is an MLX checkpoint (reference, "Model Hub"). Any network failure (DNS,
refused, timeout, a non-2xx answer, offline mode) is ``offline: true`` with the
reason, never an exception. Nothing is downloaded.
"""

from __future__ import annotations

import os
from typing import Any

#: Results one search answers.
SEARCH_LIMIT = 30
#: Seconds a search may take.
SEARCH_TIMEOUT_S = 10.0


def search(query: str, limit: int = SEARCH_LIMIT) -> dict[str, Any]:
    """Search the hub (``HF_ENDPOINT``, read now) for MLX models.

    Args:
        query (str): the search text.
        limit (int): most results. Default: :data:`SEARCH_LIMIT`.

    Returns:
        dict: ``{"ok": True, "offline": False, "results": [{"id", "downloads",
        "likes", "size_estimate": None}]}``, or ``{"ok": True, "offline": True,
        "error", "results": []}``.
    """
    from huggingface_hub import HfApi, constants

    try:
        if constants.HF_HUB_OFFLINE:
            raise ConnectionError("offline mode is on (HF_HUB_OFFLINE)")
        api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
        found = list(api.list_models(search=query, filter="mlx", limit=limit))
    except Exception as exc:  # any network failure is the offline state
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"ok": True, "offline": True, "error": reason[:300], "results": []}
    results = [
        {
            "id": m.id,
            "downloads": int(m.downloads or 0),
            "likes": int(m.likes or 0),
            "size_estimate": None,
        }
        for m in found
        if "mlx" in (m.tags or ["mlx"]) or getattr(m, "library_name", None) == "mlx"
    ]
    return {"ok": True, "offline": False, "results": results}
