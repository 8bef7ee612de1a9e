"""Reading parity responses: SSE parsing, the fields a case compares and the
tolerant comparator (exact on text, ids and ints; a tolerance on floats, like
TGI's integration snapshots).

A response is *observed* as a JSON-able dict: ``status``, ``content_type`` and
either ``events`` + ``done`` (an SSE stream) or ``json`` (+ ``text`` when short).
Each field reads the same thing from mlx_lm.server's and mlxspec's shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

TOLERANCE = 1e-4  # on logprob values (the bound)
VOLATILE = ("id", "created", "system_fingerprint", "model")  # never compared, never recorded
Observed = dict[str, Any]


def parse_sse(text: str) -> tuple[list[Any], bool]:
    """Split an SSE body into its ``data:`` payloads (JSON-decoded) and whether
    it ended with ``[DONE]``. Comments (``: keepalive``) are skipped."""
    events: list[Any] = []
    done = False
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if not data:
            continue
        payload = "\n".join(data)
        if payload == "[DONE]":
            done = True
            continue
        try:
            events.append(strip_volatile(json.loads(payload)))
        except ValueError:
            events.append(payload)
    return events, done


def strip_volatile(body: Any) -> Any:
    """``body`` without the keys that change on every response (:data:`VOLATILE`)."""
    if isinstance(body, dict):
        return {k: v for k, v in body.items() if k not in VOLATILE}
    return body


# Fields: what a case compares, read the same way from either server ---------


def _chunks(o: Observed) -> list[dict]:
    return [e for e in o.get("events") or [] if isinstance(e, dict)]


def _choice(o: Observed) -> dict | None:
    body = o.get("json")
    if isinstance(body, dict) and body.get("choices"):
        return body["choices"][0]
    return None


def _stream_choices(o: Observed) -> list[dict]:
    return [c for e in _chunks(o) for c in e.get("choices") or []]


def f_content(o: Observed) -> Any:
    """Generated text: message content / completion text, or the joined stream deltas."""
    if "events" in o:
        pieces = [
            (c.get("delta") or {}).get("content") or c.get("text") or "" for c in _stream_choices(o)
        ]
        return "".join(pieces)
    ch = _choice(o)
    if ch is None:
        return None
    return ch["message"].get("content") if "message" in ch else ch.get("text")


def f_finish_reason(o: Observed) -> Any:
    """The choice's finish_reason; for a stream the last non-null one."""
    if "events" in o:
        reasons = [c.get("finish_reason") for c in _stream_choices(o) if c.get("finish_reason")]
        return reasons[-1] if reasons else None
    ch = _choice(o)
    return ch.get("finish_reason") if ch else None


def f_usage(o: Observed) -> Any:
    """prompt/completion/total token counts, from the body or any stream chunk."""
    found = [e["usage"] for e in _chunks(o) if e.get("usage")] if "events" in o else []
    usage = found[-1] if found else (o.get("json") or {}).get("usage")
    if not isinstance(usage, dict):
        return None
    return {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _logprob_entries(o: Observed) -> list[dict] | None:
    ch = _choice(o)
    block = ch.get("logprobs") if ch else None
    return block["content"] if isinstance(block, dict) else None


def f_logprobs(o: Observed) -> Any:
    """The whole logprobs block (``None`` when absent); for ``logprobs: true`` cases."""
    ch = _choice(o)
    return ch.get("logprobs") if ch else None


def f_token_ids(o: Observed) -> Any:
    """Generated token ids, from a ``logprobs: true`` block."""
    entries = _logprob_entries(o)
    return None if entries is None else [e.get("id") for e in entries]


def f_top_logprobs(o: Observed) -> Any:
    """Per position, the top-k candidates as a set (sorted by id): mlx-lm's
    order is argpartition's, unspecified."""
    entries = _logprob_entries(o)
    if entries is None:
        return None
    return [sorted(e.get("top_logprobs", []), key=lambda t: t["id"]) for e in entries]


def f_top_choice(o: Observed) -> Any:
    """Per position, the most likely top-k candidate (under greedy decoding the
    generated token); ties go to the lower id."""
    entries = _logprob_entries(o)
    if entries is None:
        return None
    return [
        max(e["top_logprobs"], key=lambda t: (t["logprob"], -t["id"]))
        if e.get("top_logprobs")
        else None
        for e in entries
    ]


def f_top_entry(o: Observed) -> Any:
    """Per position, the entry's own id/token/logprob: mlx-lm's is the first of
    its unordered top-k (a listed deviation for k > 1), ours the argmax."""
    entries = _logprob_entries(o)
    if entries is None:
        return None
    return [{k: e.get(k) for k in ("id", "token", "logprob")} for e in entries]


def f_stream_logprobs(o: Observed) -> Any:
    """Whether any stream chunk carries logprobs (neither server sends them)."""
    return any(c.get("logprobs") for c in _stream_choices(o))


def f_role(o: Observed) -> Any:
    """The assistant role: the message's, or the first stream delta's."""
    if "events" in o:
        roles = [(c.get("delta") or {}).get("role") for c in _stream_choices(o)]
        return next((r for r in roles if r), None)
    ch = _choice(o)
    return ch["message"].get("role") if ch and "message" in ch else None


def f_object(o: Observed) -> Any:
    """``object`` of the body, or of the stream chunks that carry choices."""
    if "events" in o:
        return sorted({e.get("object") for e in _chunks(o) if e.get("choices")})
    body = o.get("json")
    return body.get("object") if isinstance(body, dict) else None


def f_error_message(o: Observed) -> Any:
    """The error text: mlx-lm's ``{"error": "<msg>"}`` or ours ``{"error": {"message"}}``."""
    err = (o.get("json") or {}).get("error") if isinstance(o.get("json"), dict) else None
    return err.get("message") if isinstance(err, dict) else err


def f_models_shape(o: Observed) -> Any:
    """``/v1/models``: ``object`` and, per row, id/created types and ``object``."""
    body = o.get("json")
    if not isinstance(body, dict):
        return None
    rows = [
        {
            "id": type(r.get("id")).__name__,
            "object": r.get("object"),
            "created": type(r.get("created")).__name__,
        }
        for r in body.get("data") or []
    ]
    return {"object": body.get("object"), "data": rows}


def f_models_rows(o: Observed) -> Any:
    """``/v1/models``: ``object`` and the distinct row shapes (as :func:`f_models_shape`
    gives them), however many rows: mlxspec lists a Whisper model beside the chat
    model (docs/deviations.md), and every row keeps the shape."""
    shape = f_models_shape(o)
    if shape is None:
        return None
    distinct = {json.dumps(r, sort_keys=True) for r in shape["data"]}
    return {"object": shape["object"], "rows": [json.loads(r) for r in sorted(distinct)]}


FIELDS: dict[str, Callable[[Observed], Any]] = {
    "status": lambda o: o["status"],
    "content_type": lambda o: o["content_type"],
    "raw": lambda o: o.get("text"),
    "json": lambda o: o.get("json"),
    "done": lambda o: o.get("done"),
    "content": f_content,
    "finish_reason": f_finish_reason,
    "usage": f_usage,
    "logprobs": f_logprobs,
    "token_ids": f_token_ids,
    "top_logprobs": f_top_logprobs,
    "top_choice": f_top_choice,
    "top_entry": f_top_entry,
    "stream_logprobs": f_stream_logprobs,
    "role": f_role,
    "object": f_object,
    "error_message": f_error_message,
    "models_shape": f_models_shape,
    "models_rows": f_models_rows,
}


def diff(ours: Any, ref: Any, tol: float = TOLERANCE, path: str = "") -> list[str]:
    """Where two JSON values differ: exact on strings, ints, bools and ``None``,
    within ``tol`` on floats, recursively on lists (length and order) and dicts (keys).

    Returns:
        list[str]: one ``path: ours != ref`` line per difference; empty when equal.
    """
    here = path or "."
    if isinstance(ours, bool) or isinstance(ref, bool):
        return [] if ours is ref else [f"{here}: {ours!r} != {ref!r}"]
    if isinstance(ours, (int, float)) and isinstance(ref, (int, float)):
        if isinstance(ours, int) and isinstance(ref, int):
            return [] if ours == ref else [f"{here}: {ours} != {ref}"]
        return [] if abs(ours - ref) <= tol else [f"{here}: {ours} != {ref} (tol {tol})"]
    if isinstance(ours, dict) and isinstance(ref, dict):
        if ours.keys() != ref.keys():
            return [f"{here}: keys {sorted(ours)} != {sorted(ref)}"]
        return [d for k in ours for d in diff(ours[k], ref[k], tol, f"{path}.{k}")]
    if isinstance(ours, list) and isinstance(ref, list):
        if len(ours) != len(ref):
            return [f"{here}: {len(ours)} items != {len(ref)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(ours, ref, strict=True))
            for d in diff(a, b, tol, f"{path}[{i}]")
        ]
    return [] if ours == ref else [f"{here}: {_short(ours)} != {_short(ref)}"]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def top_order_violations(o: Observed) -> list[str]:
    """The reference's rule for our block: top_logprobs sorted by logprob,
    descending, and each entry equal to its first (the argmax)."""
    out = []
    for i, e in enumerate(_logprob_entries(o) or []):
        top = e.get("top_logprobs") or []
        values = [t["logprob"] for t in top]
        if values != sorted(values, reverse=True):
            out.append(f"[{i}] top_logprobs not sorted")
        if top and {k: e.get(k) for k in ("id", "token", "logprob")} != top[0]:
            out.append(f"[{i}] entry is not top_logprobs[0]")
    return out
