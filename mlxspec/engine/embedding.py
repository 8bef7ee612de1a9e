"""Text embeddings from a decoder model (Qwen3-Embedding style).

A Qwen3-Embedding model is a plain Qwen3 decoder whose last-layer hidden state
at the final token is the embedding (last-token pooling), L2-normalised so that
similarity is a dot product (Qwen3-Embedding model card; sentence-transformers
``pooling_mode_lasttoken``). Queries may be prefixed with an instruction in the
model card's format ``Instruct: {instruction}\\nQuery:{text}``. A shorter
vector keeps the first dimensions of the pooled state and is normalised again
(Matryoshka representation learning, Kusupati et al. 2022, which
Qwen3-Embedding is trained for; OpenAI's ``dimensions`` parameter).

:func:`is_embedding_model` decides at load time whether the served model is one;
:func:`embed_texts` is the awaitable entry point for handlers; :func:`embed`
runs on the engine thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mlxspec.engine.prompt import off_loop, token_prompt
from mlxspec.engine.types import ContextLengthError, PromptError

#: Texts embedded per engine-thread job; generation steps interleave between jobs.
CHUNK = 16
#: Files sentence-transformers writes next to a model it can load.
_SENTENCE_TRANSFORMERS_FILES = ("config_sentence_transformers.json", "modules.json")


@dataclass(frozen=True)
class Embeddings:
    """Embeddings of a batch of texts.

    Args:
        vectors (tuple[tuple[float, ...], ...]): one unit-length vector per
            text, in input order; length = the model's hidden size, or the
            ``dimensions`` asked for.
        tokens (int): input tokens read, all texts together.
    """

    vectors: tuple[tuple[float, ...], ...]
    tokens: int


def is_embedding_model(path: Path, model_id: str) -> bool:
    """Whether the model folder holds an embedding model.

    Evidence, any of: sentence-transformers files
    (``config_sentence_transformers.json``, ``modules.json``); a ``config.json``
    ``architectures`` entry that is a bare backbone (e.g. ``Qwen3Model``), not
    a ``...ForCausalLM`` head; or "embedding" in the model id or folder name
    (``Qwen3-Embedding-0.6B``).

    Args:
        path (Path): the model folder.
        model_id (str): the served id.

    Returns:
        bool: True for an embedding model.
    """
    if any((path / name).is_file() for name in _SENTENCE_TRANSFORMERS_FILES):
        return True
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    architectures = (config.get("architectures") if isinstance(config, dict) else None) or []
    if any(isinstance(a, str) and a.endswith("Model") for a in architectures):
        return True
    return "embedding" in model_id.lower() or "embedding" in path.name.lower()


def query_text(text: str, instruction: str | None) -> str:
    """``text`` in Qwen3-Embedding's query format when an instruction is given.

    Args:
        text (str): the text to embed.
        instruction (str | None): the task description, or ``None`` for a
            plain (document) embedding.

    Returns:
        str: ``"Instruct: {instruction}\\nQuery:{text}"`` or ``text``.
    """
    return text if instruction is None else f"Instruct: {instruction}\nQuery:{text}"


def hidden_size(model: Any) -> int | None:
    """The length of ``model``'s pooled state (``args.hidden_size`` of an mlx-lm
    model), or ``None`` when the model does not say."""
    size = getattr(getattr(model, "args", None), "hidden_size", None)
    return size if isinstance(size, int) else None


async def embed_texts(
    engine: Any,
    texts: Sequence[str | Sequence[int]],
    instruction: str | None,
    dimensions: int | None = None,
) -> Embeddings:
    """Embed ``texts`` with the served model (forwards on the engine thread).

    Each text is encoded with the tokenizer's own special-token handling
    (Qwen3-Embedding's tokenizer appends ``<|endoftext|>``, whose state is the
    embedding); an input of token ids (OpenAI's pre-tokenized ``input``) is
    embedded as given, without the instruction.

    Args:
        engine (Engine): the started engine.
        texts (Sequence[str | Sequence[int]]): texts, or token ids of the
            served model, to embed.
        instruction (str | None): optional query instruction (:func:`query_text`);
            an empty one is none.
        dimensions (int | None): keep this many leading dimensions (>= 1) of
            each pooled state before normalising. Default: ``None`` (all).

    Returns:
        Embeddings: unit vectors and the token count.

    Raises:
        PromptError: ``dimensions`` exceeds the model's hidden size (``param``
            ``dimensions``); a text encodes to no tokens, or a token id is
            outside the vocabulary (``input[i]``).
        ContextLengthError: a text exceeds the context window (or the
            operator's cap).
    """
    size = hidden_size(engine.model)
    if dimensions is not None and size is not None and dimensions > size:
        raise PromptError(
            f"dimensions must be at most {size} for this model (its embedding size), "
            f"got {dimensions}",
            param="dimensions",
        )
    encoded = await off_loop(_encode_all, engine.tokenizer, texts, instruction or None)
    prompts = []
    for i, tokens in enumerate(encoded):
        param = f"input[{i}]" if len(texts) > 1 else "input"
        if not isinstance(texts[i], str):
            tokens = token_prompt(tokens, engine.info.vocab_size, param=param)
        if not tokens:
            raise PromptError("the input is empty after tokenization", param=param)
        if len(tokens) > engine.admission.context_limit:
            raise ContextLengthError(
                f"{engine.admission.context_words()}, but the input has {len(tokens)} tokens.",
                param=param,
            )
        prompts.append(tokens)
    vectors: list[list[float]] = []
    for start in range(0, len(prompts), CHUNK):  # decode steps may run between chunks
        vectors += await engine.run_exclusive(
            partial(embed, engine.model, prompts[start : start + CHUNK], dimensions)
        )
    return Embeddings(tuple(tuple(v) for v in vectors), sum(len(p) for p in prompts))


def _encode_all(
    tokenizer: Any, texts: Sequence[str | Sequence[int]], instruction: str | None
) -> list[list[int]]:
    """Token ids of each text, token-id inputs as given (a prompt thread's work)."""
    return [
        list(tokenizer.encode(query_text(text, instruction)))
        if isinstance(text, str)
        else list(text)
        for text in texts
    ]


def embed(
    model: Any, prompts: Sequence[Sequence[int]], dimensions: int | None = None
) -> list[list[float]]:
    """Last-token-pooled, L2-normalised hidden states. Engine thread only.

    Each prompt runs alone (no padding, so no pad token can leak into the
    pooled state); the backbone is ``model.model``, whose output is the final
    normed hidden state ``[1, T, H]`` in mlx-lm's decoder models.

    Args:
        model: an mlx-lm model with a ``model`` backbone attribute.
        prompts (Sequence[Sequence[int]]): token ids per text, each non-empty.
        dimensions (int | None): leading dimensions kept before normalising
            (Matryoshka truncation); ``None`` keeps all ``H``.

    Returns:
        list[list[float]]: one float32 unit vector (as Python floats) per prompt.
    """
    import mlx.core as mx

    out = []
    for tokens in prompts:
        hidden = model.model(mx.array(list(tokens), dtype=mx.uint32)[None])
        last = hidden[0, -1, :dimensions].astype(mx.float32)
        # The epsilon only guards an all-zero state; real states have norm >> 1e-12.
        unit = last / mx.maximum(mx.linalg.norm(last), 1e-12)
        out.append(unit.tolist())
    return out
