"""The typed boundary between handlers and the engine.

Requests and results are frozen dataclasses; a running request emits a small
tagged union of events (:class:`Delta`, :class:`Finished`, :class:`Failed`).
Nothing here imports MLX, so handlers and tests can use these types cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings, passed to ``mlx_lm.sample_utils.make_sampler``.

    Args:
        temperature (float): softmax temperature; ``0`` means greedy (argmax).
            Default: ``0.0`` (``mlx_lm.server``'s default).
        top_p (float): nucleus mass in ``[0, 1]``; ``0`` or ``1`` is off (the
            reference's "0 = off", as in ``make_sampler``). Default: ``1.0``.
        top_k (int): keep the k most likely tokens; ``0`` is off. Default: ``0``.
        min_p (float): min-p threshold relative to the top token; ``0`` is off.
            Default: ``0.0``.
        xtc_probability (float): chance per step of applying XTC. Default: ``0.0``.
        xtc_threshold (float): XTC probability threshold. Default: ``0.1``.
        seed (int | None): seeds the request's own random stream
            (:class:`~.sampling.SeededSampler`; with XTC, MLX's global RNG
            before the request runs alone, as ``mlx_lm.server`` does).
            Default: ``None``.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    seed: int | None = None


@dataclass(frozen=True)
class LogitsParams:
    """Logits processor settings, passed to ``make_logits_processors``.

    Penalties of ``0`` are off. Context sizes count recent tokens (prompt
    included, as in mlx-lm's ``generate_step``).

    Args:
        logit_bias (tuple[tuple[int, float], ...]): additive per-token-id bias.
        repetition_penalty (float): multiplicative, sign-aware (CTRL paper).
        repetition_context_size (int): window for ``repetition_penalty``.
        presence_penalty (float): subtracted once if the token is in the window.
        presence_context_size (int): window for ``presence_penalty``.
        frequency_penalty (float): subtracted per occurrence in the window.
        frequency_context_size (int): window for ``frequency_penalty``.
    """

    logit_bias: tuple[tuple[int, float], ...] = ()
    repetition_penalty: float = 0.0
    repetition_context_size: int = 20
    presence_penalty: float = 0.0
    presence_context_size: int = 20
    frequency_penalty: float = 0.0
    frequency_context_size: int = 20


ConstraintKind = Literal["json_object", "json_schema", "regex", "ebnf", "choice", "structural_tag"]


@dataclass(frozen=True)
class Constraint:
    """A grammar the generated text must match, enforced by a per-step token
    bitmask after the logits processors (structured output, forced tool calls).

    Args:
        kind (str): one of :data:`ConstraintKind`.
        spec (str): the grammar as text: a JSON Schema (JSON), a regex, an EBNF
            grammar, a JSON array of choice strings, or an xgrammar structural
            tag (JSON); empty for ``json_object``.
        any_whitespace (bool): allow any JSON whitespace (schema kinds). Default: ``True``.
    """

    kind: ConstraintKind
    spec: str = ""
    any_whitespace: bool = True


@dataclass(frozen=True)
class GenerationRequest:
    """One generation job.

    Args:
        prompt (tuple[int, ...]): prompt token ids (already templated).
        max_tokens (int | None): cap on generated tokens; ``None`` means until
            EOS or the end of the context window.
        stop (tuple[str, ...]): stop strings matched on decoded text.
        sampling (SamplingParams): sampler settings.
        logits (LogitsParams): logits processor settings.
        logprobs (bool): report each generated token's log-probability.
        top_logprobs (int): report the k most likely tokens per step (``0`` off).
        session (str | None): prompt-cache session label (``session_id``,
            ``prompt_cache_key`` or an affinity header). Default: ``None``.
        constraint (Constraint | None): grammar the output must match. Default: ``None``.
        shared_prefill (bool): sibling requests on the same prompt follow (the
            ``n`` choices of one request): the batched lane prefills the prompt
            once into the prompt cache and every sibling starts from it.
            Default: ``False``.
        continuation (bool): the prompt ends inside text the output continues
            (an assistant prefill), so the output keeps a leading space, which
            mlx-lm's detokenizers drop at the start of an answer. Default: ``False``.
        adapter (tuple[str, ...]): the mounted LoRA adapters to generate with, by
            id, in the order their residuals are summed; ``()`` is the base model.
            Resolved to weights when the request starts. Default: ``()``.
        media (MediaInputs | None): the processed images the prompt's media
            tokens stand for; the vision wing prefills it, the batch decodes it.
            Default: ``None``.
    """

    prompt: tuple[int, ...]
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    logits: LogitsParams = field(default_factory=LogitsParams)
    logprobs: bool = False
    top_logprobs: int = 0
    session: str | None = None
    constraint: Constraint | None = None
    shared_prefill: bool = False
    continuation: bool = False
    adapter: tuple[str, ...] = ()
    media: MediaInputs | None = None


@dataclass(frozen=True, eq=False)
class MediaInputs:
    """What a vision model's processor made of a prompt's media, beside its tokens.

    Args:
        arrays (Mapping[str, Any]): NumPy arrays by the processor's names
            (``pixel_values``: float32 patches, ``attention_mask``: int,
            ``image_grid_thw``: int ``(images, 3)``, ...); the engine thread
            turns them into MLX arrays.
        images (int): images in the prompt.
        digest (str): a content hash of the processed media (the encoder-output
            cache's key). Default: ``""``.
    """

    arrays: Mapping[str, Any]
    images: int = 0
    digest: str = ""


class MediaPrompt(list[int]):
    """A prompt's token ids (media tokens included) that carries the processed
    media they refer to (:attr:`media`); a list, so every surface that counts,
    checks or submits a prompt takes it as it takes any other."""

    def __init__(self, tokens: Iterable[int], media: MediaInputs) -> None:
        super().__init__(tokens)
        #: The processed media (see :class:`MediaInputs`).
        self.media = media


@dataclass(frozen=True)
class TopLogprob:
    """One candidate token at a position.

    Args:
        id (int): the token id.
        token (str): its raw vocabulary piece (``convert_ids_to_tokens``, e.g. ``"ĠHello"``).
        logprob (float): its natural-log probability.
        token_bytes (bytes): the bytes the token decodes to (possibly a partial
            UTF-8 sequence). Default: ``b""``.
    """

    id: int
    token: str
    logprob: float
    token_bytes: bytes = b""


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one generated token, from the distribution after the
    logits processors and before the sampler (mlx-lm ``generate_step``).

    Args:
        id (int): the generated token id.
        logprob (float): its natural-log probability.
        top (tuple[TopLogprob, ...]): the most likely tokens, sorted descending;
            empty unless ``top_logprobs`` was requested.
        token_bytes (bytes): the bytes the generated token decodes to (possibly
            a partial UTF-8 sequence). Default: ``b""``.
        eos (bool): the token ended the generation (an EOS token, counted in
            ``completion_tokens`` but never part of the text). Default: ``False``.
        in_stop (bool): the token's text lies wholly in the stop string that
            ended the output (or past its start): counted, never part of the
            text (:class:`~.stops.HeldLogprobs`). Default: ``False``.
    """

    id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()
    token_bytes: bytes = b""
    eos: bool = False
    in_stop: bool = False

    @property
    def in_content(self) -> bool:
        """Whether part of the token's text is in the returned text (not EOS, not the stop's)."""
        return not (self.eos or self.in_stop)


@dataclass(frozen=True)
class Delta:
    """New output: text safe to show (UTF-8 complete, no part of a stop string),
    the tokens generated since the last event, and logprob entries, each
    token's once and in order: those of the tokens ``text`` holds part of (an
    entry waits with its held-back text, :class:`~.stops.HeldLogprobs`), and,
    on the last ``Delta``, those marked ``eos`` or ``in_stop``."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Speculation:
    """What speculative decoding did for one request (``usage.speculation``).

    Args:
        drafted (int): draft tokens proposed.
        accepted (int): drafts the target's verify steps kept.
        target_calls (int): target-model forward calls that decoded it.
    """

    drafted: int
    accepted: int
    target_calls: int


@dataclass(frozen=True)
class Fill:
    """What token fast-forwarding did for one request (``usage.fill``, the
    reference's fields; ``--fill strict``, :mod:`.speculative.fill`).

    Args:
        events (int): forced spans that emitted tokens.
        injected (int): span tokens emitted (counted in ``completion_tokens``).
        span_lens (tuple[int, ...]): tokens emitted of each such span, in order.
        truncated (int): spans cut by the token budget or the per-step cap.
        decode_steps (int): tokens the model sampled (the rest of the reply).
        verify_events (int): spans fed to a verify forward.
        verify_accepted (int): span tokens the model's own choice agreed with.
        verify_rejected (int): span tokens it did not (dropped, KV rewound).
        checkpoint_ms (float): host time in the grammar's look-ahead and rollback.
    """

    events: int
    injected: int
    span_lens: tuple[int, ...]
    truncated: int
    decode_steps: int
    verify_events: int
    verify_accepted: int
    verify_rejected: int
    checkpoint_ms: float


@dataclass(frozen=True)
class Finished:
    """The request ended normally.

    Args:
        finish_reason (str): ``"stop"`` (EOS or stop string) or ``"length"``.
        prompt_tokens (int): prompt length in tokens.
        completion_tokens (int): generated tokens, counting the EOS token as mlx-lm does.
        cached_tokens (int): prompt tokens reused from a prompt cache. Default: ``0``.
        lane (str): ``"serial"``, ``"serial+spec"`` (alone, with kept drafts) or
            ``"batched"``: how the request ran. Default: ``"serial"``.
        stop_sequence (str | None): the request's stop string that ended the
            output, ``None`` when EOS or the token budget did (Anthropic's
            ``stop_sequence``). Default: ``None``.
        speculation (Speculation | None): draft counts, for a request that
            could speculate under a mounted draft source. Default: ``None``.
        fill (Fill | None): fast-forwarding counts, for a request that could
            fill under ``--fill strict``. Default: ``None``.
    """

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    lane: str = "serial"
    stop_sequence: str | None = None
    speculation: Speculation | None = None
    fill: Fill | None = None


@dataclass(frozen=True)
class Failed:
    """The request failed inside the engine; ``message`` is safe to show.

    Args:
        message (str): what went wrong, for the client.
        error (str): the row of the error table (``mlxspec.errors``) it is shown
            as. Default: ``"server_error"`` (a 500); ``"group_unavailable"`` (503,
            type ``engine_unavailable``) when a sharded server lost a rank
            (:mod:`.distributed`).
    """

    message: str
    error: str = "server_error"


@dataclass(frozen=True)
class Cancelled:
    """The request was cancelled (client disconnect); no more events follow."""


Event = Delta | Finished | Failed | Cancelled


class JobAbandoned(Exception):
    """The outcome of an exclusive job (``Engine.run_exclusive``) closed unfinished:
    its caller stopped waiting (nobody reads it) or the engine shut down."""


class EngineRequestError(ValueError):
    """A request the engine cannot run as given (a client error).

    Args:
        message (str): user-facing description.
        param (str | None): the request field at fault. Default: ``None``.
    """

    #: The row of the error table (``mlxspec.errors.ERROR_TABLE``) a client is shown.
    error_kind = "invalid_request"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class GroupUnavailableError(EngineRequestError):
    """A sharded server lost a process of its group (:mod:`.distributed`): it
    takes no more work and is exiting (a 503, so a balancer tries elsewhere)."""

    error_kind = "group_unavailable"


class NotShardableError(EngineRequestError):
    """Work a server sharded over several processes does not run (embeddings,
    decision scoring, adapter mounts): a 400 naming why, in every surface's
    own envelope (never ``/v1/systemone``'s 422 validation detail)."""

    error_kind = "not_shardable"


class PromptError(EngineRequestError):
    """The prompt could not be built (template failure, unsupported content)."""


class ContextLengthError(EngineRequestError):
    """The prompt does not fit the model's context window."""


@dataclass(frozen=True)
class ModelInfo:
    """What the served model is, for ``/v1/models`` and limits.

    Args:
        id (str): the id every response echoes.
        context_window (int): maximum prompt + completion tokens.
        created (int): server start time, Unix seconds.
        source (str): where the weights came from (``local``, ``hf-cache``, ``gguf``, ``embedded``).
        vocab_size (int | None): rows of the output logits, so valid token ids
            are ``[0, vocab_size)``; ``None`` if unknown. Default: ``None``.
        embedding (bool): the model is an embedding model (serves
            ``/v1/embeddings``; see :func:`.embedding.is_embedding_model`).
            Default: ``False``.
        weights (str | None): fingerprint of the weight files
            (:func:`.loader.weights_fingerprint`); ``None`` if unknown. Default: ``None``.
        media (tuple[str, ...]): the media parts it takes, in the reference's
            names (``"vision"``, ``"video"``, ``"audio"``); ``()`` for a
            text-only model. Default: ``()``.
    """

    id: str
    context_window: int
    created: int
    source: str = "local"
    vocab_size: int | None = None
    embedding: bool = False
    weights: str | None = None
    media: tuple[str, ...] = ()
