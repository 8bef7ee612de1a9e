"""A client generated from our document with openapi-python-client, at test time,
making chat, completion, decision and models calls against the tiny live server.

The client is generated from the document the server serves (``/openapi.json``,
its component ``$ref``s kept), and generation must be silent on both streams:
the generator reports a dropped endpoint or schema on stderr and still exits 0.
Generation goes to pytest's temp dir (nothing generated is committed). The
generated client reads only the JSON branch of a 200 that may also stream
(``/work/shared/notes/connexion-3.md`` section 6, problem 1), so streams go
through its httpx client and each frame is parsed with the generated
``ChatCompletionChunk``/``CompletionChunk`` models. The client's httpx
clients check every response against the document as well.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from mlxspec.conformance.httpx_checks import async_check_hook, check_hook

PACKAGE = "mlxspec_generated_client"
NO_EOS = {"2": -1e9}  # the tiny model's EOS id


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


@pytest.fixture(scope="module")
def served(tiny_server) -> dict[str, Any]:
    """The document the tiny server serves."""
    r = httpx.get(f"{tiny_server.base}/openapi.json", timeout=30)
    assert r.status_code == 200
    return r.json()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, served: dict[str, Any]) -> Path:
    """The package openapi-python-client generates from the served document."""
    root = tmp_path_factory.mktemp("generated")
    # openapi-python-client (0.29) emits code that does not import for an operation with
    # several request bodies (``Unset`` undefined), and knows bytes bodies only as
    # application/octet-stream: the audio operations (multipart/form-data or JSON; a
    # dictation chunk as octet-stream, audio/pcm or audio/*) keep one body here, the one
    # the SDKs send. The other bodies are the contract tests' and the audio tests' to check.
    document = json.loads(json.dumps(served))
    kept = {
        "/v1/audio/transcriptions": "multipart/form-data",
        "/v1/audio/translations": "multipart/form-data",
        "/v1/audio/sessions/{session_id}/audio": "application/octet-stream",
    }
    for path, item in document["paths"].items():
        for operation in item.values():
            content = (
                operation.get("requestBody", {}).get("content", {})
                if isinstance(operation, dict)
                else {}
            )
            if len(content) > 1:
                assert path in kept, f"{path} has several request bodies: {list(content)}"
                operation["requestBody"]["content"] = {kept[path]: content[kept[path]]}
    (root / "openapi.json").write_text(json.dumps(document))
    # No post-hooks: formatting the output needs ruff on PATH, and its absence is a warning.
    (root / "config.yaml").write_text("post_hooks: []\n")
    cli = Path(sys.executable).with_name("openapi-python-client")
    args = ["generate", "--path", str(root / "openapi.json"), "--meta", "none"]
    done = subprocess.run(
        [
            str(cli),
            *args,
            "--config",
            str(root / "config.yaml"),
            "--output-path",
            str(root / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # Any warning (stderr) means a part of the document was dropped.
    assert not done.stderr.strip(), done.stderr
    assert done.stdout.strip() == f"Generating {root / PACKAGE}", output
    return root


@pytest.fixture(scope="module")
def gen(generated: Path) -> Iterator[ModuleType]:
    """The generated package, imported; every ``gen.api`` module and ``gen.models`` loaded."""
    sys.path.insert(0, str(generated))
    try:
        package = importlib.import_module(PACKAGE)
        for path in sorted((generated / PACKAGE / "api").glob("*/*.py")):
            importlib.import_module(f"{PACKAGE}.api.{path.parent.name}.{path.stem}")
        importlib.import_module(f"{PACKAGE}.models")
        yield package
    finally:
        sys.path.remove(str(generated))
        for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def _api(gen: ModuleType, tag: str, operation: str) -> Any:
    return importlib.import_module(f"{gen.__name__}.api.{tag}.{operation}")


def test_every_operation_is_generated(served: dict[str, Any], generated: Path) -> None:
    api = generated / PACKAGE / "api"
    made = {f"{p.parent.name}.{p.stem}" for p in api.glob("*/*.py") if p.stem != "__init__"}
    declared = {
        f"{_snake(op['tags'][0])}.{_snake(op['operationId'])}"
        for item in served["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    assert "decisions.create_system_one_decision" in declared
    assert made == declared


def test_models_are_the_named_components(served: dict[str, Any], gen: ModuleType) -> None:
    schemas = served["components"]["schemas"]
    objects = [name for name, schema in schemas.items() if schema.get("type") == "object"]
    assert all(hasattr(gen.models, name) for name in objects), objects
    models = [path.stem for path in Path(gen.models.__file__).parent.glob("*.py")]
    # Inline objects and union branches add some; an expanded document added one
    # per copy (844 models, ``CreateChatCompletionResponse200`` ...).
    assert len(models) < 2.5 * len(schemas), len(models)
    assert not [m for m in models if re.search(r"_response_\d{3}", m)]


@pytest.fixture()
def client(gen: ModuleType, tiny_server) -> Iterator[Any]:
    hooks = {"event_hooks": {"response": [check_hook]}}
    with gen.Client(base_url=tiny_server.base, timeout=60, httpx_args=hooks) as c:
        yield c


def chat_request(gen: ModuleType, **fields: Any) -> Any:
    m = gen.models
    message = m.ChatMessage(role=m.ChatMessageRole.USER, content="hello")
    return m.CreateChatCompletionRequest.from_dict(
        {"messages": [message.to_dict()], "logit_bias": NO_EOS, "temperature": 0, **fields}
    )


def sse_payloads(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def test_chat_completion_is_typed(gen: ModuleType, client: Any) -> None:
    m = gen.models
    body = chat_request(gen, max_tokens=5)
    assert body.to_dict()["messages"] == [{"role": "user", "content": "hello"}]
    r = _api(gen, "chat", "create_chat_completion").sync_detailed(client=client, body=body)
    assert r.status_code == 200
    out = r.parsed
    assert isinstance(out, m.ChatCompletion)
    assert out.object_ == "chat.completion" and out.model == "tiny-llama"
    choice = out.choices[0]
    assert isinstance(choice.message, m.ChatCompletionMessage)
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason == m.ChatCompletionChoicesItemFinishReason.LENGTH
    assert isinstance(out.usage, m.Usage) and out.usage.completion_tokens == 5


def test_chat_stream_through_the_generated_httpx_client(gen: ModuleType, client: Any) -> None:
    m = gen.models
    body = chat_request(gen, max_tokens=6)
    whole = _api(gen, "chat", "create_chat_completion").sync(client=client, body=body)
    request = {**body.to_dict(), "stream": True, "stream_options": {"include_usage": True}}
    with client.get_httpx_client().stream("POST", "/v1/chat/completions", json=request) as r:
        payloads = sse_payloads(r.read().decode())
    assert payloads[-1] == "[DONE]"
    *chunks, usage = [m.ChatCompletionChunk.from_dict(json.loads(p)) for p in payloads[:-1]]
    assert usage.choices == []
    deltas = [c.choices[0].delta for c in chunks]
    assert all(isinstance(d, m.ChatCompletionDelta) for d in deltas)
    text = "".join(d.content for d in deltas if isinstance(d.content, str))
    assert text == whole.choices[0].message.content
    assert usage.usage.completion_tokens == 6


def test_text_completion_and_stream(gen: ModuleType, client: Any) -> None:
    m = gen.models
    body = m.CreateCompletionRequest.from_dict(
        {"prompt": "hello", "max_tokens": 4, "temperature": 0, "logit_bias": NO_EOS}
    )
    whole = _api(gen, "completions", "create_completion").sync(client=client, body=body)
    assert isinstance(whole, m.Completion) and whole.object_ == "text_completion"
    request = {**body.to_dict(), "stream": True}
    r = client.get_httpx_client().post("/v1/completions", json=request)
    chunks = [m.CompletionChunk.from_dict(json.loads(p)) for p in sse_payloads(r.text)[:-1]]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_models_health_and_index(gen: ModuleType, client: Any) -> None:
    m = gen.models
    listed = _api(gen, "models", "list_models").sync(client=client)
    assert isinstance(listed, m.ModelList)
    row = listed.data[0]
    assert isinstance(row, m.Model) and row.id == "tiny-llama" and row.context_window == 256
    assert isinstance(row.capabilities, m.ModelCapabilities)
    assert row.capabilities["chat_completions"] is True
    one = _api(gen, "models", "retrieve_model").sync(client=client, model_id="tiny-llama")
    assert isinstance(one, m.Model) and one.id == "tiny-llama"
    missing = _api(gen, "models", "retrieve_model").sync_detailed(client=client, model_id="x")
    assert missing.status_code == 404 and isinstance(missing.parsed, m.ErrorResponse)
    assert isinstance(_api(gen, "system", "health").sync(client=client), m.Health)
    index = _api(gen, "system", "api_index").sync(client=client)
    assert isinstance(index, m.ApiIndex) and index.model == "tiny-llama"


def test_errors_are_typed(gen: ModuleType, client: Any) -> None:
    m = gen.models
    body = m.CreateChatCompletionRequest.from_dict({"messages": []})
    r = _api(gen, "chat", "create_chat_completion").sync_detailed(client=client, body=body)
    assert r.status_code == 400
    assert isinstance(r.parsed, m.ErrorResponse)
    assert (r.parsed.error.message, r.parsed.error.param) == ("messages required", "messages")


def test_systemone_decision_is_typed(gen: ModuleType, client: Any) -> None:
    m = gen.models
    body = m.CreateSystemOneRequest.from_dict(
        {
            "model": "m",
            "state": {"ticket": "late"},
            "questions": {"late": {"type": "noul", "instructions": "Is it late?"}},
        }
    )
    r = _api(gen, "decisions", "create_system_one_decision").sync_detailed(client=client, body=body)
    assert r.status_code == 200, r.content
    assert isinstance(r.parsed, m.SystemOneDecision)
    assert list(r.parsed.answers.to_dict()) == ["late"]


def test_async_call(gen: ModuleType, tiny_server) -> None:
    async def go() -> Any:
        hooks = {"event_hooks": {"response": [async_check_hook]}}
        async with gen.Client(base_url=tiny_server.base, timeout=60, httpx_args=hooks) as c:
            body = chat_request(gen, max_tokens=2)
            return await _api(gen, "chat", "create_chat_completion").asyncio(client=c, body=body)

    out = asyncio.run(go())
    assert isinstance(out, gen.models.ChatCompletion) and out.usage.completion_tokens == 2
