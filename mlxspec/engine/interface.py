"""What handlers may ask of the engine: :class:`EngineProtocol`.

The one boundary between the HTTP side and the engine (``STYLE.md``, "A typed
engine boundary"): the model's facts and defaults, prompt building, admission
checks, the grammar cache, submitting a generation, exclusive MLX work
(scoring, embeddings, bandwidth probes), a place in the admission queue for
work that generates nothing, plain snapshots for the read-only views and the
prompt cache's operations, and the registry of mounted LoRA adapters.
:class:`~mlxspec.engine.Engine` implements it, and
so does the tests' ``FakeEngine`` (``tests/fakes.py``); handlers type the
engine as this protocol and never touch its admission, counters, memory,
tokenizer or caches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from mlxspec.engine.adapters.registry import AdapterRegistry
from mlxspec.engine.embedding import Embeddings
from mlxspec.engine.loop.handles import RequestHandle
from mlxspec.engine.sampling.sampler import GenerationDefaults
from mlxspec.engine.scoring import ScoredAnswers
from mlxspec.engine.snapshots import ChatFormat, FitSnapshot, StatsSnapshot
from mlxspec.engine.template_sandbox import TemplateBudget
from mlxspec.engine.types import Constraint, GenerationRequest, ModelInfo

T = TypeVar("T")


@runtime_checkable
class EngineProtocol(Protocol):
    """The engine as handlers see it.

    Attributes:
        info (ModelInfo): the served model: id, context window, vocabulary
            size, start time, whether it embeds.
        defaults (GenerationDefaults): sampling defaults for omitted fields
            (server flags over the model's ``generation_config.json``).
        adapters (AdapterRegistry): the mounted LoRA adapters: ids, checks,
            listings and the default from any thread; ``mount`` and ``unmount``
            only inside :meth:`run_exclusive` (the engine thread).
    """

    info: ModelInfo
    defaults: GenerationDefaults
    adapters: AdapterRegistry

    @property
    def chat_format(self) -> ChatFormat:
        """The served tokenizer's chat template text, inferred tool-call parser
        and thinking marker (what :func:`mlxspec.parsers.detect` reads)."""
        ...

    # Prompt building (the caller's thread; no MLX work).
    def chat_prompt(
        self,
        messages: list,
        tools: list | None = None,
        template_kwargs: dict | None = None,
        budget: TemplateBudget | None = None,
    ) -> list[int]:
        """Template and tokenize chat messages (``budget`` bounds a template the
        request brings). Raises ``PromptError``, ``TemplateBoundError``."""
        ...

    def request_template(self, template_kwargs: Mapping[str, Any] | None) -> Any:
        """The chat template a request's ``chat_template_kwargs`` bring, or
        ``None`` (a name of one of the model's own templates is not one)."""
        ...

    def text_prompt(self, prompt: str) -> list[int]:
        """Tokenize a raw completion prompt (no template)."""
        ...

    def decode_tokens(self, ids: Sequence[int]) -> str:
        """The text of token ids of the served model (special tokens kept)."""
        ...

    def count_text_tokens(self, text: str) -> int:
        """Tokens ``text`` encodes to, without special tokens (usage counts)."""
        ...

    def check_fits(self, prompt_tokens: int, param: str = "messages") -> None:
        """Raise ``ContextLengthError`` unless the prompt leaves room for one token."""
        ...

    def grammar_problem(self, constraint: Constraint) -> str | None:
        """Compile ``constraint`` ahead of :meth:`submit`; ``None`` if it will be
        enforced, else why not. Thread-safe; slow the first time."""
        ...

    # Work.
    def submit(
        self,
        request: GenerationRequest,
        prompt_param: str = "messages",
        *,
        group: int = 1,
        admitted: bool = False,
    ) -> RequestHandle:
        """Queue ``request`` (from a running event loop); iterate the handle for
        its events. Raises ``ContextLengthError``, ``ContextBudgetError``,
        ``EngineRequestError``, ``QueueFullError``."""
        ...

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the engine thread between decode steps; await its result."""
        ...

    def hold(self, job: str) -> AbstractContextManager[None]:
        """A place in the admission queue for work that generates nothing
        (``job``: ``"decision"``, ``"embedding"``) for a ``with`` block.
        Raises ``QueueFullError`` naming ``job``."""
        ...

    async def score(self, messages: list[dict], answers: Sequence[str]) -> ScoredAnswers:
        """Score ``answers`` as the assistant's reply to ``messages``
        (:func:`~mlxspec.engine.scoring.score_answers`)."""
        ...

    async def embed(
        self,
        texts: Sequence[str | Sequence[int]],
        instruction: str | None,
        dimensions: int | None = None,
    ) -> Embeddings:
        """Embed ``texts`` (:func:`~mlxspec.engine.embedding.embed_texts`)."""
        ...

    # Read-only views.
    def stats_snapshot(self) -> StatsSnapshot:
        """Request counters, admission and batch state now."""
        ...

    def fit_snapshot(self) -> FitSnapshot:
        """The model's memory facts and the operator's limits."""
        ...

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """``prompt_cache`` (and ``ssd_cache`` with an SSD tier) counters, by section."""
        ...

    def distributed_block(self) -> dict[str, Any] | None:
        """A model sharded over processes: ``world_size``, ``backend``, ``mode``,
        each rank's weight bytes, ``healthy`` (and ``failure`` once the group
        is lost); ``None`` on one process."""
        ...

    # Prompt cache operations.
    def close_cache_session(self, session: str) -> None:
        """Forget ``session``'s checkpoint association; its entries stay cached."""
        ...

    def flush_cache(self, timeout: float) -> dict[str, Any]:
        """Write every pending SSD snapshot within ``timeout`` seconds (blocks);
        the report says whether all are ``durable``."""
        ...

    def drain(self, timeout: float) -> int:
        """Wait for the requests in flight, then demote the prompt cache to the
        SSD tier within ``timeout`` seconds (blocks); returns the entries demoted."""
        ...


if TYPE_CHECKING:  # mypy checks that the engine implements the protocol
    from mlxspec.engine.engine import Engine

    _ENGINE: type[EngineProtocol] = Engine
