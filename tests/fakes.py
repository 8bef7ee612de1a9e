"""The tests' one engine double: :class:`FakeEngine`, an :class:`EngineProtocol`.

It builds prompts as the real engine does (the real tokenizer and chat template
of a model folder, mlx-lm's ``TokenizerWrapper``) and answers every
``submit`` with a script instead of a model, so a test can make the engine say
exactly what it wants (a failure mid-stream, a prompt-cache hit, a tool call in
a model's own markup) and read back what the engine was asked (``requests``,
``prompts``, ``chats``). No MLX, no engine thread.
``tests/api/test_interface.py`` checks it against the protocol, member by
member, as it checks ``Engine``.

Imported as ``tests.fakes``; fixtures stay in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from mlxspec.engine import (
    AdapterRegistry,
    AdmissionLimits,
    Cancelled,
    ChatFormat,
    Constraint,
    Delta,
    Embeddings,
    Event,
    Failed,
    Finished,
    FitSnapshot,
    GenerationDefaults,
    GenerationRequest,
    ModelInfo,
    ModelMemory,
    RequestHandle,
    ScoredAnswers,
    StatsSnapshot,
    TemplateBudget,
    TokenLogprob,
    request_template,
)
from mlxspec.engine.caches.ssd_cache import SsdCache
from mlxspec.engine.loop.admission import Admission
from mlxspec.engine.loop.lanes import StepTimes
from mlxspec.engine.prompt import encode_text, normalize_messages, render_chat
from mlxspec.engine.snapshots import read_chat_format

T = TypeVar("T")

#: What a script says: a text chunk becomes a ``Delta``; an event is sent as is.
Step = str | Event
#: A fixed list of steps, or a function of the request returning one.
Script = Sequence[Step] | Callable[[GenerationRequest], Sequence[Step]]

_ENDINGS = (Finished, Failed, Cancelled)


class FakeEngine:
    """The engine protocol with real prompts and scripted outputs.

    Set :attr:`script` before a request. Each ``str`` step is a ``Delta`` of
    that text (token id = the step's index, with a logprob when the request
    asks for them); each event step is sent as is; a script that does not end
    the stream (``Finished``, ``Failed``, ``Cancelled``) ends with
    ``Finished(finish_reason, len(prompt), number of steps)``.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (``mlx_lm.tokenizer_utils.load``).
        info (ModelInfo | None): the served model. Default: ``None`` (id
            ``"fake"``, a 4096-token window, no vocabulary bound).
        defaults (GenerationDefaults | None): sampling defaults. Default: ``None`` (none).
        limits (AdmissionLimits | None): the wait-queue depth of its (real)
            admission, which ``hold`` takes places in. Default: ``None`` (64 waiting).
    """

    def __init__(
        self,
        tokenizer: Any,
        info: ModelInfo | None = None,
        defaults: GenerationDefaults | None = None,
        limits: AdmissionLimits | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.info = info or ModelInfo(id="fake", context_window=4096, created=0)
        self.defaults = defaults or GenerationDefaults()
        #: No model, so nothing can be mounted: every request runs on the base model.
        self.adapters = AdapterRegistry(None, self.info.id)
        #: What every request is answered with (see the class docstring).
        self.script: Script = []
        #: How a script without an ending ends (``"length"``: the budget ran out).
        self.finish_reason = "stop"
        #: What ``grammar_problem`` answers (``None``: every grammar compiles).
        self.grammar_reason: str | None = None
        #: Seconds before each step; ``0`` delivers the whole script at ``submit``.
        self.delay = 0.0
        #: While set to an unset ``threading.Event``, a delayed script's first
        #: event waits for it (a prefill that ends when the test says so).
        self.first_token_gate: threading.Event | None = None
        #: Every submitted request, in order.
        self.requests: list[GenerationRequest] = []
        #: The text of every chat prompt built, in order.
        self.prompts: list[str] = []
        #: The messages of every chat prompt built, as given, in order.
        self.chats: list[list] = []
        #: Sessions closed through ``close_cache_session``.
        self.closed_sessions: list[str] = []
        #: What ``distributed_block`` answers (a test of a sharded server's routes sets it).
        self.group_block: dict[str, Any] | None = None
        self._admission = Admission(limits or AdmissionLimits(), 1, self.info.context_window)
        self._replays: set[asyncio.Task[None]] = set()

    @classmethod
    def from_dir(cls, model_dir: Path, model_id: str = "scripted") -> FakeEngine:
        """A fake on the tokenizer and chat template of a model folder (e.g. a
        tool fixture model, :func:`fixtures.tool_models.build_tool_model`).

        Args:
            model_dir (Path): the folder.
            model_id (str): the id responses echo. Default: ``"scripted"``.
        """
        from mlx_lm.tokenizer_utils import load

        info = ModelInfo(id=model_id, context_window=4096, created=0, vocab_size=266)
        return cls(load(Path(model_dir)), info)

    @functools.cached_property
    def chat_format(self) -> ChatFormat:
        """The tokenizer's chat template text, inferred tool parser and thinking marker."""
        return read_chat_format(self.tokenizer)

    def chat_prompt(
        self,
        messages: list,
        tools: list | None = None,
        template_kwargs: dict | None = None,
        budget: TemplateBudget | None = None,
    ) -> list[int]:
        """Template and tokenize like the real engine; remembers the messages and the text."""
        tokens = self._render(messages, tools, template_kwargs, budget)
        self.chats.append(messages)
        self.prompts.append(self.tokenizer.decode(tokens))
        return tokens

    def request_template(self, template_kwargs: Mapping[str, Any] | None) -> Any:
        """The template ``chat_template_kwargs`` bring, as the real engine reads them."""
        return request_template(self.tokenizer, template_kwargs)

    def text_prompt(self, prompt: str) -> list[int]:
        """Tokenize a raw prompt like the real engine."""
        return encode_text(self.tokenizer, prompt)

    def decode_tokens(self, ids: Sequence[int]) -> str:
        """The text of token ids."""
        return self.tokenizer.decode(list(ids))

    def count_text_tokens(self, text: str) -> int:
        """Tokens ``text`` encodes to, without special tokens."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def check_fits(self, prompt_tokens: int, param: str = "messages") -> None:
        """The real window check (``ContextLengthError``)."""
        self._admission.check_window(prompt_tokens, param)

    def grammar_problem(self, constraint: Constraint) -> str | None:
        """The scripted compile result (:attr:`grammar_reason`) for any constraint."""
        return self.grammar_reason

    def submit(
        self,
        request: GenerationRequest,
        prompt_param: str = "messages",
        *,
        group: int = 1,
        admitted: bool = False,
    ) -> RequestHandle:
        """Answer ``request`` with the current script on a real handle (there is
        no queue: ``group`` and ``admitted`` have nothing to admit)."""
        self.check_fits(len(request.prompt), prompt_param)
        self.requests.append(request)
        handle = RequestHandle(request, asyncio.get_running_loop())
        events = self._events(request)
        if not self.delay:
            for event in events:
                handle.emit(event)
            return handle
        replay = asyncio.ensure_future(
            self._replay(handle, events, self.delay, self.first_token_gate)
        )
        self._replays.add(replay)  # the loop keeps only a weak reference
        replay.add_done_callback(self._replays.discard)
        return handle

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on a worker thread (a generator is stepped to its return value)."""
        return await asyncio.to_thread(_run_whole, fn)

    def hold(self, job: str) -> AbstractContextManager[None]:
        """A place in the (real) admission queue for ``job``."""
        return self._admission.hold(self._admission.held, job)

    async def score(self, messages: list[dict], answers: Sequence[str]) -> ScoredAnswers:
        """Every answer equally likely (log-likelihood 0); the input tokens are
        the prompt's and each answer's."""
        prompt = len(self._render(messages))
        used = sum(
            prompt + len(self.tokenizer.encode(a, add_special_tokens=False)) for a in answers
        )
        return ScoredAnswers((0.0,) * len(answers), (1 / len(answers),) * len(answers), used)

    async def embed(
        self,
        texts: Sequence[str | Sequence[int]],
        instruction: str | None,
        dimensions: int | None = None,
    ) -> Embeddings:
        """The same unit vector (``dimensions`` long, default 4) for every text."""
        vector = (1.0,) + (0.0,) * ((dimensions or 4) - 1)
        tokens = sum(len(t) if not isinstance(t, str) else len(self.text_prompt(t)) for t in texts)
        return Embeddings(tuple(vector for _ in texts), tokens)

    def stats_snapshot(self) -> StatsSnapshot:
        """Nothing ever waits or runs; ``submitted`` counts the requests."""
        adm, idle = self._admission, StepTimes().snapshot()
        return StatsSnapshot(
            submitted=len(self.requests),
            outcomes={"completed": 0, "cancelled": 0, "failed": 0},
            in_flight=adm.held,
            waiting=0,
            running=0,
            max_queue=adm.limits.max_queue,
            rejected=dict(adm.rejected),
            enforced_context=None,
            max_batch=1,
            kv_bytes=0,
            kv_budget_bytes=None,
            steps=idle,
            solo_steps=idle,
        )

    def fit_snapshot(self) -> FitSnapshot:
        """No weights, no KV cache; the window is the limit; ``kv_quant`` as a
        full-precision model with no attention layers describes it."""
        from mlxspec.engine.caches.kv_scheme import KvScheme

        kv_quant = KvScheme().describe("float32", 0)
        return FitSnapshot(
            ModelMemory(0, 0, "float32", 0), None, self.info.context_window, kv_quant
        )

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """No prompt cache: no sections."""
        return {}

    def distributed_block(self) -> dict[str, Any] | None:
        """One process: :attr:`group_block` (``None`` unless a test sets one)."""
        return self.group_block

    def close_cache_session(self, session: str) -> None:
        """Remember ``session`` in :attr:`closed_sessions`."""
        self.closed_sessions.append(session)

    def flush_cache(self, timeout: float) -> dict[str, Any]:
        """Nothing pending: the report of a cache without an SSD tier."""
        return SsdCache.empty_flush_report()

    def drain(self, timeout: float) -> int:
        """No prompt cache: nothing to demote."""
        return 0

    def _render(
        self,
        messages: list,
        tools: list | None = None,
        template_kwargs: dict | None = None,
        budget: TemplateBudget | None = None,
    ) -> list[int]:
        normalized = normalize_messages(messages, self.info.id)
        return render_chat(
            self.tokenizer, normalized, tools=tools, template_kwargs=template_kwargs, budget=budget
        )

    def _events(self, request: GenerationRequest) -> list[Event]:
        steps = self.script(request) if callable(self.script) else self.script
        events: list[Event] = []
        for i, step in enumerate(steps):
            if isinstance(step, str):
                logprobs = (TokenLogprob(id=i, logprob=-0.25 * i),) if request.logprobs else ()
                events.append(Delta(step, (i,), logprobs))
            else:
                events.append(step)
        if not events or not isinstance(events[-1], _ENDINGS):
            events.append(Finished(self.finish_reason, len(request.prompt), len(steps)))
        return events

    @staticmethod
    async def _replay(
        handle: RequestHandle,
        events: list[Event],
        delay: float,
        gate: threading.Event | None = None,
    ) -> None:
        """Emit ``events`` ``delay`` seconds apart until the handle is cancelled
        (``cancel`` itself sends ``Cancelled``); the first waits for ``gate``."""
        while gate is not None and not gate.is_set() and not handle.cancelled:
            await asyncio.sleep(0.01)
        for event in events:
            if not isinstance(event, _ENDINGS):
                await asyncio.sleep(delay)
            if handle.cancelled:
                return
            handle.emit(event)


def _run_whole(fn: Callable[[], Any]) -> Any:
    """``fn()``; a generator (a stepped exclusive job) runs to its return value."""
    result = fn()
    if not isinstance(result, Generator):
        return result
    try:
        while True:
            next(result)
    except StopIteration as done:
        return done.value
