"""Chat messages with media parts, made ready for a vision model's template.

Every surface reaches the engine as OpenAI chat messages: chat ``image_url``
(``{"url", "detail"}``) and its ``image`` alias, Anthropic ``image`` blocks
(``source``: ``base64`` or ``url``; inside ``tool_result`` too, which arrive as
``tool`` messages), Responses ``input_image`` (already ``image_url``).
:func:`media_messages` turns each image into the ``{"type": "image"}`` marker
mlx-vlm's chat templates place (``mlx_vlm.prompt_utils``), in document order,
and lists where each one comes from. Parts of a kind the model does not take
are a :class:`~mlxspec.engine.types.PromptError` naming the model and part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlxspec.engine.types import PromptError

__all__ = ["IMAGE_PARTS", "MediaRef", "has_media", "media_messages"]

IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})
VIDEO_PARTS = frozenset({"video_url", "video"})
AUDIO_PARTS = frozenset({"input_audio", "audio", "audio_url"})


@dataclass(frozen=True)
class MediaRef:
    """One media part: its kind (``"image"``), its source (a ``data:`` or
    http(s) URL, or bare base64) and where it is (``messages[0].content[1]``)."""

    kind: str
    source: str
    where: str


def has_media(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message holds a non-text content part of a media kind."""
    kinds = IMAGE_PARTS | VIDEO_PARTS | AUDIO_PARTS
    return any(
        isinstance(part, Mapping) and part.get("type") in kinds
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )


def image_source(part: Mapping[str, Any], where: str) -> str:
    """The URL or base64 text an image (or video) part names, in any of the
    accepted shapes (``image_url: {url}``, ``image``, ``video_url: {url}``,
    ``video``, ``data``, an Anthropic ``source``).

    Raises:
        PromptError: the part names no image.
    """
    for key in ("image_url", "image", "video_url", "video", "url", "data"):
        value = part.get(key)
        if isinstance(value, Mapping):
            value = value.get("url")
        if isinstance(value, str) and value:
            return value
    source = part.get("source")
    if isinstance(source, Mapping):
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            kind = source.get("media_type") or "application/octet-stream"
            return f"data:{kind};base64,{source['data']}"
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return str(source["url"])
    raise PromptError(f"{where}: the part names no media (url or data)", param=where)


def media_messages(
    messages: Sequence[Mapping[str, Any]], model_id: str, takes: Sequence[str]
) -> tuple[list[dict], list[MediaRef]]:
    """Template-ready copies of ``messages`` with image markers, and the media.

    Args:
        messages (Sequence[Mapping]): normalized-shape chat messages (validated).
        model_id (str): the served model, named in errors.
        takes (Sequence[str]): what the model takes (``"vision"``, ...).

    Returns:
        tuple: the messages (a content with media becomes a list of
        ``{"type": "image"}`` and ``{"type": "text", "text": ...}`` parts; others
        a string) and the media in document order.

    Raises:
        PromptError: a part of a kind the model does not take, or an image
            part without a source.
    """
    from mlxspec.engine.prompt_messages import normalize_messages

    # tool-call arguments decoded, reasoning aliased, as for any chat prompt
    plain = [{**m, "content": ""} if isinstance(m.get("content"), list) else m for m in messages]
    out = normalize_messages(plain, model_id)
    refs: list[MediaRef] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            parts, found = _parts(content, f"messages[{i}].content", model_id, takes)
            refs.extend(found)
            text = [p["text"] for p in parts if p["type"] == "text"]
            out[i]["content"] = parts if found else "".join(text)
    return out, refs


def _parts(
    content: list, param: str, model_id: str, takes: Sequence[str]
) -> tuple[list[dict], list[MediaRef]]:
    parts: list[dict] = []
    refs: list[MediaRef] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        where = f"{param}[{j}]"
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in IMAGE_PARTS and "vision" in takes:
            refs.append(MediaRef("image", image_source(part, where), where))
            parts.append({"type": "image"})
        elif kind in VIDEO_PARTS and "video" in takes:
            refs.append(MediaRef("video", image_source(part, where), where))
            parts.append({"type": "video"})
        elif kind in IMAGE_PARTS | VIDEO_PARTS | AUDIO_PARTS:
            raise PromptError(
                f"model {model_id} does not take '{kind}' content parts "
                f"(it takes: {', '.join(takes) or 'text only'})",
                param=where,
            )
        else:
            raise PromptError(
                f"unsupported content part type '{kind}': a prompt here holds text and images",
                param=where,
            )
    return parts, refs
