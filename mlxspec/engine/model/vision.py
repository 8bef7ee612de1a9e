"""The vision wing: a model folder whose config names an architecture mlx-vlm
supports is served with mlx-vlm's model class and processor beside the
mlx-lm text model.

Text-only requests run on the mlx-lm model as on any model (mlx-lm loads the
language half of these checkpoints: ``qwen2_5_vl`` -> ``qwen2_vl``); a request
with media runs on mlx-vlm's ``Model`` (vision tower + the same language
weights, shared, not loaded twice where the two classes name them alike), its
prompt built by mlx-vlm's processor (:meth:`VisionWing.prepare`). mlx-vlm is
the optional ``mlxspec[vision]`` extra (pinned ``mlx-vlm==0.7.10``); without
it a VLM folder is a one-line start-up error naming the extra.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from mlxspec.engine.media.encoder_cache import EncoderCache
from mlxspec.engine.model.loader import ModelLoadError

__all__ = ["VisionWing", "load_vision", "media_kinds", "vision_family"]

log = logging.getLogger("mlxspec.engine")

#: Families whose ``get_input_embeddings`` takes the vision tower's output as
#: ``cached_image_features`` (mlx-vlm's Qwen-VL models), so it can be cached.
FEATURE_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl"})
#: Families whose processor takes video frames (mlx-vlm's Qwen-VL models).
VIDEO_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl"})
#: What installs mlx-vlm (named in the start-up error without it).
EXTRA = "pip install 'mlxspec[vision]'"


def media_kinds(config: dict) -> tuple[str, ...]:
    """The media a checkpoint's ``config.json`` says its model takes, in the
    reference's names: ``("vision",)``, ``("vision", "audio")`` or ``()``.

    A config with a ``vision_config`` (``audio_config``) section is a
    vision (audio) model; mlx-vlm decides below whether it can run it.
    """
    kinds = []
    if isinstance(config.get("vision_config"), dict):
        kinds.append("vision")
    if isinstance(config.get("audio_config"), dict):
        kinds.append("audio")
    return tuple(kinds)


def _mlx_vlm_model_type(config: dict, path: Path) -> str:
    """The mlx-vlm family of ``config``.

    Raises:
        ModelLoadError: mlx-vlm is not installed, or has no class for it.
    """
    try:
        from mlx_vlm.utils import get_model_and_args, get_model_type
    except ImportError:
        raise ModelLoadError(
            f"{path} is a vision-language model ({config.get('model_type')}): serving it "
            f"needs mlx-vlm, the vision extra ({EXTRA})"
        ) from None
    model_type = get_model_type(config) or ""
    try:
        get_model_and_args(dict(config))
    except (ValueError, ImportError) as e:
        raise ModelLoadError(
            f"{path}: mlx-vlm has no model class for {model_type!r} ({e})"
        ) from None
    return model_type


@dataclass
class VisionWing:
    """mlx-vlm's model and processor for requests with media.

    Attributes:
        model: mlx-vlm's ``Model`` (``get_input_embeddings`` merges the towers'
            features into the prompt embeddings; ``language_model`` decodes).
        processor: its processor (tokenizer + image processor).
        model_type (str): mlx-vlm's family, e.g. ``"qwen2_5_vl"``.
        media (tuple[str, ...]): what it takes: ``"vision"`` (images) and, for
            :data:`VIDEO_FAMILIES`, ``"video"``.
        shared (bool): the language weights are the text model's arrays.
    """

    model: Any
    processor: Any
    model_type: str
    media: tuple[str, ...]
    shared: bool = False
    encoder_cache: EncoderCache = field(default_factory=EncoderCache)

    def extra_bytes(self) -> int:
        """Bytes of weights the wing holds beside the text model: its towers and
        projector, plus its language weights unless :attr:`shared` (a second copy)."""
        from mlx.utils import tree_flatten

        # tree_flatten's stub also admits the dict it fills for a dict ``destination``
        params = cast(list[tuple[str, Any]], tree_flatten(self.model.parameters()))
        return sum(
            int(value.nbytes)
            for name, value in params
            if not (self.shared and name.startswith("language_model."))
        )

    def image_features(self, pixel_values: Any, extra: dict[str, Any], key: str) -> Any | None:
        """The vision tower's features for a prompt's images, from the encoder
        cache when ``key`` was seen (engine thread only).

        Only families whose ``get_input_embeddings`` takes precomputed features
        (``cached_image_features``: :data:`FEATURE_FAMILIES`) are cached; others
        return ``None`` and encode in the model call, uncounted.

        Args:
            pixel_values (mx.array): the processor's patches.
            extra (dict): the processor's other outputs (``image_grid_thw``).
            key (str): the media digest (:func:`~mlxspec.engine.media.encoder_cache.media_digest`).

        Returns:
            mx.array | None: the features, or ``None`` where not cached.
        """
        if self.model_type not in FEATURE_FAMILIES or extra.get("image_grid_thw") is None:
            return None
        features = self.encoder_cache.get(key)
        if features is None:
            import mlx.core as mx

            tower = self.model.vision_tower
            dtype = tower.patch_embed.proj.weight.dtype
            features = tower(
                pixel_values.astype(dtype), extra["image_grid_thw"], output_hidden_states=False
            )
            mx.eval(features)
            self.encoder_cache.put(key, features)
        return features

    def prepare(
        self, prompt: str, images: list[Any], clips: list[tuple[Any, dict]] | None = None
    ) -> tuple[list[int], dict[str, Any]]:
        """Tokenize a rendered prompt with its images through mlx-vlm's processor
        (``mlx_vlm.utils.prepare_inputs``, as ``mlx_vlm.generate`` does), so each
        image's placeholder becomes its patch tokens.

        Runs on a prompt thread; MLX arrays made here are read back to NumPy
        here (the engine thread makes its own).

        Args:
            prompt (str): the chat-templated prompt text.
            images (list[PIL.Image.Image]): in the prompt's order.
            clips (list | None): videos in the prompt's order, each its sampled
                frames and metadata (:func:`~mlxspec.engine.media.video.decode_video`).
                Default: ``None``.

        Returns:
            tuple: the token ids (media tokens included) and the processor's
            other outputs as NumPy arrays (``pixel_values``, ``attention_mask``,
            ``image_grid_thw``, ...).

        Raises:
            PromptError: the processor refused the inputs.
        """
        import numpy as np
        from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

        from mlxspec.engine.types import PromptError

        videos: dict[str, Any] = {}
        if clips:
            from mlx_vlm.utils import VideoMetadata

            videos["videos"] = [frames for frames, _ in clips]
            videos["video_metadata"] = [VideoMetadata(**meta) for _, meta in clips]
        try:
            inputs = prepare_inputs(
                self.processor,
                images=images or None,
                prompts=prompt,
                **videos,
                image_token_index=getattr(self.model.config, "image_token_index", None),
                add_special_tokens=should_add_special_tokens(self.model_type, self.processor),
            )
        except (ValueError, TypeError, IndexError) as e:
            raise PromptError(f"the model's processor could not take the media: {e}") from None
        ids = [int(t) for t in np.array(inputs["input_ids"]).reshape(-1)]
        arrays = {
            key: np.array(value)
            for key, value in inputs.items()
            if key != "input_ids" and value is not None and not isinstance(value, (str, list))
        }
        return ids, arrays


def read_config(path: Path) -> dict:
    """``path/config.json`` as a dict (``{}`` when unreadable)."""
    try:
        return dict(json.loads((path / "config.json").read_text()))
    except (OSError, ValueError):
        return {}


def vision_family(path: Path) -> str | None:
    """The mlx-vlm family of the model folder ``path``, or ``None`` for a
    text-only model; checked before any weight is read.

    Raises:
        ModelLoadError: a VLM without mlx-vlm installed (names the extra), or
            one mlx-vlm has no class for.
    """
    config = read_config(path)
    return _mlx_vlm_model_type(config, path) if media_kinds(config) else None


def load_vision(path: Path, text_model: Any) -> VisionWing | None:
    """Load the vision wing of ``path`` if its config names a vision or audio
    model, sharing ``text_model``'s language weights where the names match.

    Args:
        path (Path): the model folder.
        text_model: the mlx-lm model already loaded from it.

    Returns:
        VisionWing | None: ``None`` for a text-only model.

    Raises:
        ModelLoadError: a VLM without mlx-vlm installed (names the extra), or
            one mlx-vlm cannot load.
    """
    model_type = vision_family(path)
    if model_type is None:
        return None
    from mlx_vlm.utils import load

    try:
        model, processor = load(str(path))
    except Exception as e:  # mlx-vlm raises many kinds for a folder it cannot read
        raise ModelLoadError(f"mlx-vlm cannot load {path}: {e}") from e
    shared = _share_language_weights(model, text_model)
    # audio parts are not wired yet (docs/deviations.md): the model takes images
    media = ("vision", "video") if model_type in VIDEO_FAMILIES else ("vision",)
    return VisionWing(model, processor, model_type, media, shared)


def _share_language_weights(vlm: Any, text_model: Any) -> bool:
    """Point the VLM's language weights at the text model's arrays (one copy in
    memory, and the same float32 conversion on the CPU) when both trees name
    and shape them alike; else keep both copies."""
    from mlx.utils import tree_flatten, tree_unflatten

    lm = getattr(vlm, "language_model", None)
    source = getattr(text_model, "language_model", text_model)
    if lm is None:
        return False
    mine = dict(tree_flatten(lm.parameters()))
    theirs = dict(tree_flatten(source.parameters()))
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        log.info("vision: language weights kept apart (the two classes name them differently)")
        return False
    lm.update(tree_unflatten(list(theirs.items())))
    return True
