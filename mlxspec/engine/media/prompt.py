"""A chat prompt with images, built for the vision wing (a prompt thread's work).

The messages' media parts become image markers (:mod:`.parts`), the images are
read (``data:`` URLs locally, http(s) URLs under the fetch policy: :mod:`.fetch`)
and decoded (:mod:`.images`), the chat template renders the text with the
markers, and mlx-vlm's processor expands each marker to the image's patch
tokens (:meth:`~mlxspec.engine.model.vision.VisionWing.prepare`), so the
prompt's length (``usage.prompt_tokens``, ``count_tokens``, admission) counts
the media tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.engine.media.encoder_cache import media_digest
from mlxspec.engine.media.fetch import FetchPolicy, fetch_media
from mlxspec.engine.media.images import load_image_source, media_bytes
from mlxspec.engine.media.parts import media_messages
from mlxspec.engine.media.video import MAX_VIDEO_BYTES, decode_video
from mlxspec.engine.prompt import render_chat
from mlxspec.engine.template_sandbox import TemplateBudget
from mlxspec.engine.text_bound import TextBound
from mlxspec.engine.types import MediaInputs, MediaPrompt, PromptError

__all__ = ["MAX_IMAGES", "media_prompt"]

#: Most images one request may hold (the Responses surface's documented cap).
MAX_IMAGES = 128


def media_prompt(
    wing: Any,
    tokenizer: Any,
    model_id: str,
    policy: FetchPolicy,
    messages: Sequence[Mapping[str, Any]],
    tools: list | None = None,
    template_kwargs: dict | None = None,
    budget: TemplateBudget | None = None,
    bound: TextBound | None = None,
) -> MediaPrompt:
    """Template, fetch, decode and tokenize chat messages that hold media.

    The template renders as for any chat prompt (:func:`~mlxspec.engine.prompt.render_chat`:
    tool history, failed results, request templates and the text bound), with the
    processor as its tokenizer.

    Args:
        wing (VisionWing): the model's vision wing.
        tokenizer: the model's ``TokenizerWrapper`` (its chat template renders).
        model_id (str): named in errors.
        policy (FetchPolicy): how http(s) media URLs are fetched.
        messages (Sequence[Mapping]): validated chat messages.
        tools (list | None): tool schemas for the template. Default: ``None``.
        template_kwargs (dict | None): template variables. Default: ``None``.
        budget (TemplateBudget | None): a request template's bounds. Default: ``None``.
        bound (TextBound | None): the longest rendered text taken. Default: ``None``.

    Returns:
        MediaPrompt: the token ids (media tokens included) and the processed media.

    Raises:
        PromptError: a part the model does not take, media that cannot be
            read or decoded (``MediaError``, ``MediaUrlRejected``), too many
            images, or a template that fails or places no image.
    """
    msgs, refs = media_messages(messages, model_id, wing.media)
    if len(refs) > MAX_IMAGES:
        raise PromptError(f"at most {MAX_IMAGES} images per request, got {len(refs)}", "messages")
    if len({r.kind for r in refs}) > 1:  # mlx-vlm's Qwen-VL merges one kind per prompt
        raise PromptError(
            "image and video content parts cannot be combined in one request", "messages"
        )
    fetch = functools.partial(_fetch, policy=policy)
    images = [load_image_source(r.source, r.where, fetch) for r in refs if r.kind == "image"]
    clips = [_clip(r.source, r.where, policy) for r in refs if r.kind == "video"]
    made: dict[str, Any] = {}

    def encode(text: str) -> list[int]:
        ids, made["arrays"] = wing.prepare(text, images, clips)
        return ids

    ids = render_chat(
        tokenizer, msgs, tools=tools, template_kwargs=template_kwargs, budget=budget,
        bound=bound, encode=encode,
    )  # fmt: skip
    marker = _image_token(wing)
    if images and marker is not None and marker not in ids:
        raise PromptError(
            f"model {model_id}'s chat template placed no image token for the image parts",
            "messages",
        )
    arrays = made["arrays"]
    return MediaPrompt(ids, MediaInputs(arrays, len(images), media_digest(arrays)))


def _fetch(url: str, where: str, policy: FetchPolicy) -> bytes:
    return fetch_media(url, where, policy)


def _clip(source: str, where: str, policy: FetchPolicy) -> tuple[Any, dict[str, Any]]:
    """A video part's sampled frames and metadata (video's own 256 MB cap)."""
    video_policy = dataclasses.replace(policy, max_bytes=MAX_VIDEO_BYTES)
    fetch = functools.partial(_fetch, policy=video_policy)
    return decode_video(media_bytes(source, where, fetch, MAX_VIDEO_BYTES), where)


def _image_token(wing: Any) -> int | None:
    """The token id image patches take in the prompt, if the config says."""
    config = wing.model.config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None
