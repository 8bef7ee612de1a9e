"""The engine boundary: ``Engine`` and the tests' ``FakeEngine`` implement
``EngineProtocol`` member by member (names, signatures, annotations, sync or
async), the fake answers like the engine where both can, and handlers, the
HTTP layer and the configuration import only what ``mlxspec.engine`` exports."""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest

from mlxspec.engine import (
    AdmissionLimits,
    ContextLengthError,
    Delta,
    Engine,
    EngineProtocol,
    Finished,
    GenerationRequest,
    QueueFullError,
    TranscriberProtocol,
)
from mlxspec.engine.audio import SoloRunner, WhisperCheckpoint, WhisperService
from tests.fakes import FakeEngine

ROOT = Path(__file__).resolve().parents[2]


def protocol_members(protocol: type = EngineProtocol) -> list[str]:
    """The public members ``protocol`` declares (attributes, properties, methods)."""
    declared = [*protocol.__annotations__, *vars(protocol)]
    return sorted({n for n in declared if not n.startswith("_")})


def mismatches(cls: type, instance: object, protocol: type = EngineProtocol) -> list[str]:
    """How ``cls`` (and one ``instance`` of it, for data attributes) differs from
    ``protocol``: one line per member that is missing or declared otherwise."""
    hints = typing.get_type_hints(protocol)
    found = []
    for name in protocol_members(protocol):
        want = vars(protocol).get(name)
        got = inspect.getattr_static(cls, name, None)
        if want is None:  # a data attribute: the instance holds one of its type
            if not isinstance(getattr(instance, name, None), hints[name]):
                found.append(f"{name}: not an instance attribute of type {hints[name].__name__}")
        elif isinstance(want, property):
            getter = got.fget if isinstance(got, property) else getattr(got, "func", None)
            if not isinstance(got, property | functools.cached_property) or (
                inspect.signature(getter) != inspect.signature(want.fget)
            ):
                found.append(f"{name}: not a property returning {want.fget.__annotations__}")
        elif not callable(got):
            found.append(f"{name}: missing")
        elif inspect.signature(got) != inspect.signature(want):
            found.append(f"{name}{inspect.signature(got)} != {inspect.signature(want)}")
        elif inspect.iscoroutinefunction(got) != inspect.iscoroutinefunction(want):
            found.append(f"{name}: async differs")
    return found


@pytest.fixture(scope="module")
def fake(tiny_engine: Any) -> FakeEngine:
    return FakeEngine(tiny_engine.tokenizer, tiny_engine.info, tiny_engine.defaults)


def test_the_protocol_declares_what_handlers_ask() -> None:
    assert protocol_members() == [
        "adapters",
        "cache_stats",
        "chat_format",
        "chat_prompt",
        "check_fits",
        "close_cache_session",
        "count_text_tokens",
        "decode_tokens",
        "defaults",
        "distributed_block",
        "drain",
        "embed",
        "fit_snapshot",
        "flush_cache",
        "grammar_problem",
        "hold",
        "info",
        "request_template",
        "run_exclusive",
        "score",
        "stats_snapshot",
        "submit",
        "text_prompt",
    ]


def test_the_engine_implements_the_protocol(tiny_engine: Any) -> None:
    assert isinstance(tiny_engine, EngineProtocol)
    assert mismatches(Engine, tiny_engine) == []


def test_the_fake_implements_the_protocol(fake: FakeEngine) -> None:
    assert isinstance(fake, EngineProtocol)
    assert mismatches(FakeEngine, fake) == []


def test_a_drifted_fake_is_caught(fake: FakeEngine) -> None:
    class Drifted(FakeEngine):
        def submit(self, request: Any, prompt_param: str = "messages", **_: Any) -> Any:  # type: ignore[override]
            return super().submit(request, prompt_param)

        async def decode_tokens(self, ids: Any) -> str:  # type: ignore[override]
            return ""

        chat_format = None  # type: ignore[assignment]

    drifted = Drifted(fake.tokenizer, fake.info, fake.defaults)
    drifted.defaults = None  # type: ignore[assignment]
    assert isinstance(drifted, EngineProtocol)  # it checks presence only: the signatures tell
    assert [line.split("(")[0].split(":")[0] for line in mismatches(Drifted, drifted)] == [
        "chat_format",
        "decode_tokens",
        "defaults",
        "submit",
    ]
    assert not isinstance(object(), EngineProtocol)


def test_the_fake_answers_like_the_engine(tiny_engine: Any, fake: FakeEngine) -> None:
    """Where both can answer (prompts, tokens, the window), they agree."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert fake.chat_prompt(messages) == tiny_engine.chat_prompt(messages)
    assert fake.text_prompt("hello there") == tiny_engine.text_prompt("hello there")
    ids = tiny_engine.text_prompt("hello there")
    assert fake.decode_tokens(ids) == tiny_engine.decode_tokens(ids)
    assert fake.count_text_tokens("hello") == tiny_engine.count_text_tokens("hello")
    assert fake.chat_format == tiny_engine.chat_format
    window = tiny_engine.info.context_window
    errors = []
    for engine in (fake, tiny_engine):
        with pytest.raises(ContextLengthError) as caught:
            engine.check_fits(window, "prompt")
        errors.append((caught.value.message, caught.value.param))
    assert errors[0] == errors[1]
    assert fake.fit_snapshot().context_limit == tiny_engine.fit_snapshot().context_limit


def test_the_fake_replays_its_script_on_a_real_handle(fake: FakeEngine) -> None:
    request = GenerationRequest(prompt=(1, 2, 3), max_tokens=4, logprobs=True)

    async def run(script: Any, delay: float = 0.0) -> list:
        fake.script, fake.delay = script, delay
        return [event async for event in fake.submit(request)]

    chunks = asyncio.run(run(["a", "b"]))
    assert [type(e).__name__ for e in chunks] == ["Delta", "Delta", "Finished"]
    assert (chunks[1].text, chunks[1].token_ids, chunks[1].logprobs[0].id) == ("b", (1,), 1)
    assert chunks[-1] == Finished("stop", prompt_tokens=3, completion_tokens=2)
    ending = Finished("length", 3, 1, cached_tokens=2)
    assert asyncio.run(run(lambda r: [Delta("x"), ending], delay=0.01)) == [Delta("x"), ending]
    assert fake.requests[-1] is request


def test_the_fake_holds_places_in_a_real_queue(fake: FakeEngine) -> None:
    with fake.hold("embedding"):
        assert fake.stats_snapshot().in_flight == 1
    assert fake.stats_snapshot().in_flight == 0
    full = FakeEngine(fake.tokenizer, fake.info, limits=AdmissionLimits(max_queue=0))
    with full.hold("decision"):  # the one slot; nothing may wait behind it
        with pytest.raises(QueueFullError, match="this embedding request was not queued"):
            with full.hold("embedding"):
                pass
    assert full.stats_snapshot().rejected["queue_full"] == 1


def test_the_whisper_service_implements_the_transcriber_protocol(tmp_path: Path) -> None:
    """The audio handlers' side of the boundary: what they ask of the Whisper
    service, which asks the chat engine only ``run_exclusive`` (an
    ``EngineProtocol`` member)."""
    checkpoint = WhisperCheckpoint("whisper-tiny.en", "mlx", folder=tmp_path)
    service = WhisperService(checkpoint, SoloRunner(), tmp_path)
    try:
        assert protocol_members(TranscriberProtocol) == [
            "block",
            "created",
            "model_id",
            "multilingual",
            "transcribe",
            "unload",
            "vocabulary_usage",
        ]
        assert isinstance(service, TranscriberProtocol)
        assert mismatches(WhisperService, service, TranscriberProtocol) == []
        assert service.multilingual is False and service.block()["loaded"] is False
        assert "run_exclusive" in protocol_members()
    finally:
        service.runner.close()


def _engine_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(ROOT)}: {node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.startswith("mlxspec.engine.")
    ]


def test_handlers_http_and_config_import_only_the_engine_package() -> None:
    files = [
        *sorted((ROOT / "mlxspec/handlers").rglob("*.py")),
        *sorted((ROOT / "mlxspec/http").rglob("*.py")),
        ROOT / "mlxspec/config.py",
    ]
    assert [line for f in files for line in _engine_imports(f)] == []
