"""The prompt of a request with media, prefilled on the vision wing a chunk per
engine step, then handed to the continuous batch like any row.

mlx-vlm's ``generate_step`` embeds the prompt once (``get_input_embeddings``:
the vision tower's features merged at the media tokens, plus the positions the
model's RoPE wants) and feeds the embeddings to its language model in chunks,
all but the last prompt token, which its first decode step feeds.
:class:`MediaPrefill` does the same steps one at a time, so the engine loop
runs the batch's decode steps between them: step one embeds (the tower runs
only on an encoder-cache miss, :meth:`~mlxspec.engine.model.vision.VisionWing.image_features`),
each later step feeds at most ``prefill_step`` prompt tokens. Its KV cache is
the text model's own (mlx-lm's ``make_prompt_cache``), which mlx-vlm's language
model fills through the same ``update_and_fetch``; the language weights are
shared, so the batch decodes the row on the text model from there.

Positions: a Qwen-VL model gives media tokens mRoPE positions (an image's
patches share one temporal position), so every token after the prompt sits
``rope_deltas`` positions away from its KV index. The :class:`~.lanes.Handoff`
carries that as ``shift``, which the batch adds to the row's RoPE offset
(:class:`~.prefill.PrefillGroup`); for text the three mRoPE sections coincide,
so the text model's 1-D RoPE at the shifted position is mlx-vlm's decode step.

The prompt cache keeps its KV under the media's content digest
(``CacheNamespace.media``: token ids alone do not say which image they stood
for), so a follow-up turn about the same image prefills only what the kept
turn did not hold; the kept keys carry their mRoPE positions, and mlx-vlm's
language model gives the tail the positions of the whole prompt from the
cache's offset on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlxspec.engine.adapters.registry import NO_ADAPTER
from mlxspec.engine.loop.lanes import Handoff, LaneParts
from mlxspec.engine.loop.rows import Row
from mlxspec.engine.sampling.sampler import build_logits_processors, build_sampler

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle

__all__ = ["MediaPrefill"]


def _rope_shift(metadata: dict[str, Any]) -> int:
    """The RoPE position minus the KV index of every token after the prompt:
    mlx-vlm's ``rope_deltas`` (shape ``(1, 1)``) where the model has one, else 0."""
    deltas = metadata.get("rope_deltas")
    return 0 if deltas is None else int(deltas.reshape(-1)[0].item())


class MediaPrefill:
    """A request with media, its prompt prefilled on the vision wing a step at a time.

    Args:
        handle (RequestHandle): the request (``request.media`` set, prompt of at
            least one token).
        parts (LaneParts): the engine's parts (``parts.vision`` set).
        budget (int): tokens it may generate (>= 1).
        lane (str): reported in ``Finished`` (``"batched"`` or ``"serial"``).
    """

    def __init__(self, handle: RequestHandle, parts: LaneParts, budget: int, lane: str) -> None:
        req = handle.request
        assert req.media is not None and parts.vision is not None
        self.handle, self._parts, self._budget = handle, parts, budget
        grammar = None if parts.grammars is None else parts.grammars.for_request(req.constraint)
        self._grammar = grammar
        cache, cached = None, 0
        if req.media.digest:  # a turn about the same media, kept: its prefix
            namespace = parts.namespace_of(NO_ADAPTER, req.media.digest)
            cache, cached = parts.prompt_cache.fetch(namespace, req.prompt, req.session)
        self.row = Row(
            handle, parts.tokenizer, parts.eos, lane=lane, cached=cached, grammar=grammar
        )
        self._cache = cache if cache is not None else parts.kv.make_cache(parts.model)
        self._embeds: Any = None  # (1, prompt, hidden) once embedded
        self._metadata: dict[str, Any] = {}
        self._chunk = parts.prefill_step
        #: Prompt tokens in the KV cache so far (a kept prefix first).
        self.fed = cached
        #: Steps taken: the embedding, then one per chunk.
        self.steps = 0

    @property
    def done(self) -> bool:
        """Every prompt token but the last is in the KV cache."""
        return self._embeds is not None and self.fed >= len(self.handle.request.prompt) - 1

    def step(self) -> bool:
        """Embed the prompt (first step) or feed its next chunk; True once done.

        Raises:
            Exception: whatever mlx-vlm raised; the request fails alone.
        """
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        self.steps += 1
        with mx.stream(generation_stream):
            if self._embeds is None:
                self._embed()
                return self.done
            prompt = self.handle.request.prompt
            end = min(len(prompt) - 1, self.fed + self._chunk)
            ids = mx.array([prompt[self.fed : end]], dtype=mx.int32)
            assert self._parts.vision is not None
            self._parts.vision.model.language_model(
                inputs=ids,
                inputs_embeds=self._embeds[:, self.fed : end],
                cache=self._cache,
                n_to_process=end - self.fed,
                logits_to_keep=1,
                **self._metadata,
            )
            mx.eval([c.state for c in self._cache])
        self.fed = end
        mx.clear_cache()
        return self.done

    def _embed(self) -> None:
        """The prompt's embeddings with the media's features merged in, and the
        positions metadata mlx-vlm's language model takes with them."""
        import mlx.core as mx
        from mlx_vlm.generate.common import _chunked_prefill_enabled

        wing, req = self._parts.vision, self.handle.request
        assert wing is not None and req.media is not None
        made = {key: mx.array(value) for key, value in req.media.arrays.items()}
        pixel_values, mask = made.pop("pixel_values", None), made.pop("attention_mask", None)
        features = wing.image_features(pixel_values, made, req.media.digest)
        if features is not None:  # the tower ran once for these pixels (encoder-output cache)
            made["cached_image_features"] = features
        ids = mx.array([list(req.prompt)], dtype=mx.int32)
        out = wing.model.get_input_embeddings(ids, pixel_values, mask=mask, **made)
        metadata = {k: v for k, v in out.to_dict().items() if k != "inputs_embeds"}
        self._metadata = {k: v for k, v in metadata.items() if v is not None}
        if not _chunked_prefill_enabled(
            wing.model, input_ids=ids, inputs_embeds=out.inputs_embeds, prefill_kwargs=made
        ):
            self._chunk = len(req.prompt)  # the model takes its prompt whole (mlx-vlm's rule)
        self._embeds = out.inputs_embeds
        mx.eval(self._embeds)

    def handoff(self) -> Handoff:
        """The request, prefilled, as a row for the batch: its KV cache holds
        the prompt but its last token, which the batch feeds first."""
        assert self.done
        prompt = list(self.handle.request.prompt)
        req = self.handle.request
        return Handoff(
            row=self.row,
            feed=prompt[-1:],
            held=prompt[:-1],
            cache=self._cache if len(prompt) > 1 else None,
            max_tokens=self._budget,
            sampler=build_sampler(req.sampling, list(self._parts.xtc_special)),
            processors=build_logits_processors(req.logits),
            grammar=self._grammar,
            shift=_rope_shift(self._metadata),
        )
