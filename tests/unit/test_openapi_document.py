"""Checks on mlxspec's OpenAPI document: validity, operations, examples, request rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from mlxspec.openapi import SPEC_PATH, load_spec

SPEC = load_spec()
SPEC_URI = "urn:mlxspec:openapi"
REGISTRY = Registry().with_resource(
    SPEC_URI, Resource.from_contents(SPEC, default_specification=DRAFT202012)
)
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

#: Every operation: a forged Host (or /admin Origin), headers that stall or are too
#: large, a connection over --max-connections (mlxspec.http.guard, mlxspec.http.connections).
EDGE_CODES = {"403", "408", "431", "503"}
GENERATION_CODES = {"200", "400", "401", "413", "415", "429", "499", "500"}
#: The generating routes whose model --strict-model checks (a 404 model_not_found).
STRICT_CODES = GENERATION_CODES | {"404"}
#: GET routes behind the API key (all but /health).
READ_CODES = {"200", "400", "401", "500"}
#: The jobs routes that take a JSON body.
JOB_POST_CODES = {"200", "400", "401", "413", "415", "500"}
#: The web chat's page routes.
WEB = "mlxspec.handlers.webchat.pages"
#: The web chat's search and export routes.
WEB_SEARCH = "mlxspec.handlers.webchat.search"
#: Scoring and embeddings: no generation queue, so no 429.
LIBRARY = "mlxspec.handlers.library.routes"
LIBRARY_POST = {"200", "400", "401", "413", "415", "500"}

OPERATIONS = [
    # method, path, operationId, router controller, tag, response codes
    (
        "post",
        "/v1/chat/completions",
        "createChatCompletion",
        "mlxspec.handlers.chat.chat",
        "chat",
        STRICT_CODES,
    ),
    (
        "post",
        "/v1/completions",
        "createCompletion",
        "mlxspec.handlers.chat.completions",
        "completions",
        STRICT_CODES,
    ),
    (
        "post",
        "/v1/messages",
        "createMessage",
        "mlxspec.handlers.messages.messages",
        "messages",
        STRICT_CODES,
    ),
    (
        "post",
        "/v1/messages/count_tokens",
        "countMessageTokens",
        "mlxspec.handlers.messages.messages",
        "messages",
        {"200", "400", "401", "413", "415", "500"},
    ),
    ("get", "/v1/models", "listModels", "mlxspec.handlers.models", "models", READ_CODES),
    (
        "get",
        "/v1/models/{model_id}",
        "retrieveModel",
        "mlxspec.handlers.models",
        "models",
        READ_CODES | {"404"},
    ),
    (
        "post",
        "/v1/responses",
        "createResponse",
        "mlxspec.handlers.responses.responses",
        "responses",
        GENERATION_CODES | {"404"},
    ),
    (
        "post",
        "/v1/responses/input_tokens",
        "countResponseInputTokens",
        "mlxspec.handlers.responses.responses",
        "responses",
        {"200", "400", "401", "404", "413", "415", "500"},
    ),
    (
        "get",
        "/v1/responses/{response_id}",
        "getResponse",
        "mlxspec.handlers.responses.responses",
        "responses",
        READ_CODES | {"404"},
    ),
    (
        "delete",
        "/v1/responses/{response_id}",
        "deleteResponse",
        "mlxspec.handlers.responses.responses",
        "responses",
        READ_CODES | {"404"},
    ),
    (
        "post",
        "/v1/responses/{response_id}/cancel",
        "cancelResponse",
        "mlxspec.handlers.responses.responses",
        "responses",
        READ_CODES | {"404", "415"},
    ),
    ("get", "/health", "health", "mlxspec.handlers.system", "system", {"200", "400", "500"}),
    ("get", "/v1", "apiIndex", "mlxspec.handlers.system", "system", READ_CODES),
    ("get", "/stats", "getStats", "mlxspec.handlers.status", "operations", READ_CODES),
    ("get", "/fit", "getFit", "mlxspec.handlers.status", "operations", READ_CODES),
    ("get", "/metrics", "getMetrics", "mlxspec.handlers.status", "operations", READ_CODES),
    (
        "post",
        "/admin/cache/session/close",
        "closeCacheSession",
        "mlxspec.handlers.admin",
        "admin",
        {"200", "400", "401", "413", "415", "500"},
    ),
    (
        "post",
        "/admin/cache/flush",
        "flushCache",
        "mlxspec.handlers.admin",
        "admin",
        {"200", "400", "401", "415", "500"},
    ),
    # The worker routes (--unix only) and the --isolate parent's own route.
    (
        "post",
        "/admin/drain",
        "drainWorker",
        "mlxspec.handlers.worker",
        "admin",
        {"200", "400", "401", "415", "500"},
    ),
    (
        "post",
        "/admin/lease",
        "holdLease",
        "mlxspec.handlers.worker",
        "admin",
        {"200", "400", "401", "415", "500"},
    ),
    ("get", "/engine", "getEngine", "mlxspec.supervisor.parent", "system", READ_CODES),
    # The model library (issue 30).
    ("get", "/library", "getLibrary", LIBRARY, "library", READ_CODES),
    ("get", "/downloads", "getDownloads", LIBRARY, "library", READ_CODES),
    ("get", "/api/hub/local", "hubLocal", LIBRARY, "library", READ_CODES),
    ("get", "/api/hub/search", "hubSearch", LIBRARY, "library", READ_CODES),
    ("post", "/api/hub/download", "hubDownload", LIBRARY, "library", LIBRARY_POST | {"409"}),
    ("post", "/api/hub/serve", "hubServe", LIBRARY, "library", LIBRARY_POST | {"404"}),
    ("get", "/api/gc/plan", "gcPlan", LIBRARY, "library", READ_CODES),
    ("post", "/api/gc/execute", "gcExecute", LIBRARY, "library", LIBRARY_POST),
    ("post", "/api/model/resolve-folder", "resolveModelFolder", LIBRARY, "library", LIBRARY_POST),
    (
        "get",
        "/v1/adapters",
        "listAdapters",
        "mlxspec.handlers.adapters.adapters",
        "adapters",
        READ_CODES,
    ),
    (
        "post",
        "/v1/adapters",
        "mountAdapter",
        "mlxspec.handlers.adapters.adapters",
        "adapters",
        {"200", "400", "401", "403", "409", "413", "415", "429", "500"},
    ),
    (
        "get",
        "/v1/adapters/available",
        "listAvailableAdapters",
        "mlxspec.handlers.adapters.adapters",
        "adapters",
        READ_CODES,
    ),
    (
        "delete",
        "/v1/adapters/{adapter_id}",
        "unmountAdapter",
        "mlxspec.handlers.adapters.adapters",
        "adapters",
        READ_CODES | {"404"},
    ),
    (
        "post",
        "/v1/decisions",
        "createDecision",
        "mlxspec.handlers.decisions.decisions",
        "decisions",
        GENERATION_CODES,
    ),
    (
        "post",
        "/v1/systemone",
        "createSystemOneDecision",
        "mlxspec.handlers.decisions.decisions",
        "decisions",
        GENERATION_CODES | {"422"},
    ),
    (
        "post",
        "/v1/embeddings",
        "createEmbedding",
        "mlxspec.handlers.embeddings.embeddings",
        "embeddings",
        STRICT_CODES,
    ),
    # The web chat: public shell routes (the socket asks for the key itself).
    ("get", "/", "getWebApp", WEB, "web", {"200", "400", "404", "500"}),
    ("get", "/assets/{asset}", "getWebAsset", WEB, "web", {"200", "400", "404", "500"}),
    ("get", "/manifest.webmanifest", "getWebManifest", WEB, "web", {"200", "400", "404", "500"}),
    ("get", "/sw.js", "getServiceWorker", WEB, "web", {"200", "400", "404", "500"}),
    ("get", "/chat", "redirectChatPage", WEB, "web", {"302", "400", "404", "500"}),
    ("get", "/status", "redirectStatusPage", WEB, "web", {"302", "400", "404", "500"}),
    ("get", "/ws/chat", "openChatSocket", WEB, "web", {"101", "400", "403", "426", "500"}),
    ("get", "/api/sessions/search", "searchSessions", WEB_SEARCH, "web", READ_CODES),
    ("get", "/api/sessions/export", "exportSession", WEB_SEARCH, "web", READ_CODES | {"404"}),
    (
        "post",
        "/api/sessions/import",
        "importSession",
        "mlxspec.handlers.webchat.session_import",
        "web",
        {"200", "400", "401", "413", "415", "500"},
    ),
    (
        "get",
        "/api/settings/tool-approvals",
        "getToolApprovals",
        "mlxspec.handlers.webchat.settings",
        "web",
        READ_CODES,
    ),
    (
        "delete",
        "/api/settings/tool-approvals",
        "deleteToolApproval",
        "mlxspec.handlers.webchat.settings",
        "web",
        READ_CODES | {"413", "415"},
    ),
    # speech to text (the 503s: no Whisper checkpoint, or too many connections)
    (
        "post",
        "/v1/audio/transcriptions",
        "createTranscription",
        "mlxspec.handlers.audio.transcriptions",
        "audio",
        {"200", "400", "401", "413", "415", "499", "500"},
    ),
    (
        "post",
        "/v1/audio/translations",
        "createTranslation",
        "mlxspec.handlers.audio.transcriptions",
        "audio",
        {"200", "400", "401", "413", "415", "499", "500"},
    ),
    (
        "post",
        "/v1/audio/sessions",
        "createSession",
        "mlxspec.handlers.audio.sessions",
        "audio",
        {"200", "400", "401", "415", "429", "500"},
    ),
    (
        "delete",
        "/v1/audio/sessions/{session_id}",
        "deleteSession",
        "mlxspec.handlers.audio.sessions",
        "audio",
        {"204", "400", "401", "404", "409", "500"},
    ),
    (
        "post",
        "/v1/audio/sessions/{session_id}/audio",
        "addSessionAudio",
        "mlxspec.handlers.audio.sessions",
        "audio",
        {"200", "400", "401", "404", "409", "413", "415", "500"},
    ),
    (
        "post",
        "/v1/audio/sessions/{session_id}/finish",
        "finishSession",
        "mlxspec.handlers.audio.sessions",
        "audio",
        {"200", "400", "401", "404", "409", "500"},
    ),
    (
        "post",
        "/admin/transcription/unload",
        "unloadTranscription",
        "mlxspec.handlers.audio.transcriptions",
        "admin",
        {"200", "400", "401", "500"},
    ),
    # The jobs routes (--jobs only; the lab envelope {ok: false, error}).
    ("get", "/api/jobs", "listJobs", "mlxspec.handlers.jobs.jobs", "jobs", READ_CODES),
    ("get", "/api/jobs/{job_id}", "getJob", "mlxspec.handlers.jobs.jobs", "jobs", READ_CODES | {"404"}),
    ("delete", "/api/jobs/{job_id}", "cancelJob", "mlxspec.handlers.jobs.jobs", "jobs", READ_CODES | {"404"}),
    ("get", "/api/jobs/{job_id}/stream", "streamJob", "mlxspec.handlers.jobs.jobs", "jobs", READ_CODES),
    ("post", "/api/finetune/submit", "submitFinetune", "mlxspec.handlers.jobs.finetune", "jobs", JOB_POST_CODES),
    ("post", "/api/finetune/inspect-dataset", "inspectDataset", "mlxspec.handlers.jobs.finetune", "jobs", JOB_POST_CODES),
    ("post", "/api/finetune/merge", "mergeAdapters", "mlxspec.handlers.jobs.finetune", "jobs", JOB_POST_CODES),
    ("post", "/api/finetune/export", "exportAdapter", "mlxspec.handlers.jobs.finetune", "jobs", JOB_POST_CODES),
    ("post", "/api/quantize/inspect", "inspectQuantize", "mlxspec.handlers.jobs.quantize", "jobs", JOB_POST_CODES),
    ("post", "/api/quantize/submit", "submitQuantize", "mlxspec.handlers.jobs.quantize", "jobs", JOB_POST_CODES),
    ("post", "/api/quantize/resolve-folder", "resolveFolder", "mlxspec.handlers.jobs.quantize", "jobs", JOB_POST_CODES),
    ("get", "/api/dataset/templates", "listDatasetTemplates", "mlxspec.handlers.jobs.dataset", "jobs", READ_CODES),
    ("post", "/api/dataset/submit", "submitDataset", "mlxspec.handlers.jobs.dataset", "jobs", JOB_POST_CODES),
]

#: Responses that are a status and headers only (a redirect, the WebSocket upgrade).
HEADER_ONLY = {"101", "204", "302"}

#: Non-2xx responses that carry another body than an ``ErrorResponse``: the
#: reference answers a not-yet-durable flush with the flush report itself, and
#: System One's validation errors are FastAPI's 422 details.
REPORT_RESPONSES = {
    ("flushCache", "503"): "#/components/schemas/CacheFlushReport",
    ("createSystemOneDecision", "422"): "#/components/schemas/ValidationDetail",
    **{
        (op, "400"): "#/components/schemas/LibraryError"
        for op in ("hubDownload", "hubServe", "gcExecute", "resolveModelFolder")
    },
    ("hubDownload", "409"): "#/components/schemas/LibraryRefusal",
    ("hubServe", "404"): "#/components/schemas/LibraryError",
}

EXTENSION_FIELDS = [
    "top_k",
    "min_p",
    "xtc_probability",
    "xtc_threshold",
    "repetition_penalty",
    "repetition_context_size",
    "presence_context_size",
    "frequency_context_size",
    "session_id",
    "prompt_cache_key",
]


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _validator(ref: str) -> Draft202012Validator:
    """A 2020-12 validator for the schema at ``ref`` (a ``#/...`` pointer into the document)."""
    return Draft202012Validator({"$ref": SPEC_URI + ref}, registry=REGISTRY)


def _resolve(obj: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Follow a document-local ``$ref`` (responses, parameters); return the object and its path."""
    path: tuple[str, ...] = ()
    while "$ref" in obj:
        path = tuple(obj["$ref"].removeprefix("#/").split("/"))
        obj = SPEC
        for part in path:
            obj = obj[part]
    return obj, path


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in SPEC["paths"].items():
        for method, op in item.items():
            if method in HTTP_METHODS:
                yield method, path, op


def _media_examples() -> Iterator[tuple[str, str, str, Any]]:
    """Yield (id, media type, schema pointer, example value) for every media-type example."""
    seen: set[tuple[str, ...]] = set()
    for method, path, op in _operations():
        bodies: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        if "requestBody" in op:
            body, ref_path = _resolve(op["requestBody"])
            bodies.append((ref_path or ("paths", path, method, "requestBody"), body))
        for code, response in op["responses"].items():
            resolved, ref_path = _resolve(response)
            bodies.append((ref_path or ("paths", path, method, "responses", code), resolved))
        for where, body in bodies:
            if where in seen:
                continue
            seen.add(where)
            for media_type, media in body.get("content", {}).items():
                schema_ptr = _pointer(*where, "content", media_type, "schema")
                if "example" in media:
                    yield (
                        f"{'/'.join(where)} {media_type}",
                        media_type,
                        schema_ptr,
                        media["example"],
                    )
                for name, example in media.get("examples", {}).items():
                    example, _ = _resolve(example)
                    yield (
                        f"{'/'.join(where)} {media_type} {name}",
                        media_type,
                        schema_ptr,
                        example["value"],
                    )


MEDIA_EXAMPLES = list(_media_examples())


def test_spec_path_points_at_the_package_file() -> None:
    assert SPEC_PATH.name == "openapi.yaml"
    assert SPEC_PATH.is_file()


def test_load_spec_returns_an_independent_copy() -> None:
    first = load_spec()
    first["info"]["title"] = "changed"
    assert load_spec()["info"]["title"] == "mlxspec"


def test_document_is_valid_openapi_3_1() -> None:
    assert SPEC["openapi"] == "3.1.0"
    assert SPEC["info"]["title"] == "mlxspec"
    assert SPEC["info"]["version"] == "0.1.0"
    validate(SPEC, cls=OpenAPIV31SpecValidator)


def test_operations_are_exactly_the_listed_ones() -> None:
    declared = {(method, path) for method, path, _ in _operations()}
    assert declared == {(method, path) for method, path, *_ in OPERATIONS}


@pytest.mark.parametrize(
    ("method", "path", "operation_id", "controller", "tag", "codes"),
    OPERATIONS,
    ids=[row[2] for row in OPERATIONS],
)
def test_operation_routing_and_responses(
    method: str, path: str, operation_id: str, controller: str, tag: str, codes: set[str]
) -> None:
    op = SPEC["paths"][path][method]
    assert op["operationId"] == operation_id
    assert "." not in op["operationId"]
    assert op["x-openapi-router-controller"] == controller
    assert op["tags"] == [tag]
    assert set(op["responses"]) == codes | EDGE_CODES
    for code in codes:
        response, _ = _resolve(op["responses"][code])
        assert response["description"]
        if code in HEADER_ONLY:
            assert "content" not in response, f"{operation_id} {code} has a body"
            continue
        assert response["content"], f"{operation_id} {code} has no content"
        for media_type, media in response["content"].items():
            assert "schema" in media, f"{operation_id} {code} {media_type} has no schema"
            assert media.get("examples") or "example" in media, (
                f"{operation_id} {code} {media_type} has no example"
            )
        if code != "200":
            envelopes = {"messages": "AnthropicErrorResponse", "jobs": "LabErrorResponse"}
            envelope = envelopes.get(tag, "ErrorResponse")
            expected = REPORT_RESPONSES.get(
                (operation_id, code), f"#/components/schemas/{envelope}"
            )
            assert response["content"]["application/json"]["schema"] == {"$ref": expected}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
def test_generation_routes_declare_json_and_sse(path: str) -> None:
    op = SPEC["paths"][path]["post"]
    body = op["requestBody"]
    assert body["required"] is True
    assert list(body["content"]) == ["application/json"]
    assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}


def test_request_schemas_accept_unknown_fields_and_set_no_defaults() -> None:
    schemas = SPEC["components"]["schemas"]
    for name in ("CreateChatCompletionRequest", "CreateCompletionRequest"):
        assert schemas[name]["type"] == "object"
        assert schemas[name]["additionalProperties"] is True
    assert schemas["ChatMessage"]["additionalProperties"] is True

    # A `default` would be injected by Connexion's validator and hide that the
    # client omitted the field (omitted sampling fields use generation_config.json).
    def walk(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            yield node
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    for name in (
        "GenerationParameters",
        "CreateChatCompletionRequest",
        "CreateCompletionRequest",
        "ChatMessage",
    ):
        assert not any("default" in node for node in walk(schemas[name])), name


def test_extensions_are_marked() -> None:
    schemas = SPEC["components"]["schemas"]
    shared = schemas["GenerationParameters"]["properties"]
    for field in EXTENSION_FIELDS:
        assert shared[field].get("x-mlxspec-extension") is True, field
    chat = schemas["CreateChatCompletionRequest"]["allOf"][1]["properties"]
    assert chat["chat_template_kwargs"]["x-mlxspec-extension"] is True
    openai_fields = ["temperature", "top_p", "max_tokens", "stop", "seed", "n"]
    for field in openai_fields:
        assert "x-mlxspec-extension" not in shared[field], field
    assert "x-mlxspec-extension" not in chat["logprobs"]


def test_stream_schemas_follow_the_conventions() -> None:
    schemas = SPEC["components"]["schemas"]
    chunk_choice = schemas["ChatCompletionChunk"]["properties"]["choices"]["items"]
    assert chunk_choice["properties"]["finish_reason"] == {
        "enum": ["stop", "length", "tool_calls", None]
    }
    text_choice = schemas["CompletionChunk"]["properties"]["choices"]["items"]
    assert text_choice["properties"]["finish_reason"] == {"enum": ["stop", "length", None]}
    for event, chunk in (
        ("ChatCompletionSSEEvent", "ChatCompletionChunk"),
        ("CompletionSSEEvent", "CompletionChunk"),
    ):
        data = schemas[event]["properties"]["data"]["anyOf"]
        assert data[0] == {"const": "[DONE]"}
        assert [d["contentSchema"]["$ref"] for d in data[1:]] == [
            f"#/components/schemas/{chunk}",
            "#/components/schemas/ErrorResponse",
        ]
    assert schemas["Health"]["additionalProperties"] is False


def test_every_operation_has_examples() -> None:
    assert len(MEDIA_EXAMPLES) > 20


@pytest.mark.parametrize(
    ("media_type", "schema_ptr", "value"),
    [example[1:] for example in MEDIA_EXAMPLES],
    ids=[example[0] for example in MEDIA_EXAMPLES],
)
def test_example_matches_its_schema(media_type: str, schema_ptr: str, value: Any) -> None:
    _validator(schema_ptr).validate(value)
    if media_type != "text/event-stream" or value["data"] == "[DONE]":
        return
    # contentSchema is an annotation in 2020-12; check the frame's JSON explicitly.
    payload = json.loads(value["data"])
    if "api~1jobs" in schema_ptr:  # a job's event log
        _validator("#/components/schemas/JobEvent").validate(payload)
        return
    if "event" in value:  # a named-event stream: the JSON's type is the event name
        assert payload["type"] == value["event"]
        if "messages" in schema_ptr:  # Anthropic Messages
            anthropic_error = value["event"] == "error"
            target = "AnthropicErrorResponse" if anthropic_error else "AnthropicStreamEvent"
        elif "Transcription" in schema_ptr:  # the speech-to-text stream
            target = "TranscriptStreamEvent"
        else:
            target = "ResponseStreamEvent"
    elif "error" in payload:
        target = "ErrorResponse"
    else:
        chat = payload["id"].startswith("chatcmpl-")
        target = "ChatCompletionChunk" if chat else "CompletionChunk"
    _validator(f"#/components/schemas/{target}").validate(payload)


def test_parameter_examples_match_their_schema() -> None:
    for name, parameter in SPEC["components"]["parameters"].items():
        for example in parameter["examples"].values():
            _validator(_pointer("components", "parameters", name, "schema")).validate(
                example["value"]
            )


def test_model_id_accepts_slashes_under_connexion() -> None:
    parameter = SPEC["components"]["parameters"]["ModelId"]
    assert parameter["in"] == "path"
    assert parameter["schema"]["format"] == "path"


CHAT = "#/components/schemas/CreateChatCompletionRequest"
COMPLETION = "#/components/schemas/CreateCompletionRequest"
USER = [{"role": "user", "content": "hi"}]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, **fields}


def _completion(**fields: Any) -> dict[str, Any]:
    return {"prompt": "Once", **fields}


REJECTED = [
    # id, schema, body, path of the error (the server's `param`)
    ("messages missing", CHAT, {"model": "x"}, []),
    ("messages empty", CHAT, {"messages": []}, ["messages"]),
    (
        "role unknown",
        CHAT,
        {"messages": [{"role": "wizard", "content": "hi"}]},
        ["messages", 0, "role"],
    ),
    ("role missing", CHAT, {"messages": [{"content": "hi"}]}, ["messages", 0]),
    (
        "content number",
        CHAT,
        {"messages": [{"role": "user", "content": 5}]},
        ["messages", 0, "content"],
    ),
    (
        "text part without text",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        ["messages", 0, "content", 0],
    ),
    ("temperature negative", CHAT, _chat(temperature=-1), ["temperature"]),
    ("temperature string", CHAT, _chat(temperature="0.5"), ["temperature"]),
    ("top_p above 1", CHAT, _chat(top_p=1.5), ["top_p"]),
    ("top_k negative", CHAT, _chat(top_k=-1), ["top_k"]),
    ("top_k float", CHAT, _chat(top_k=2.5), ["top_k"]),
    ("min_p above 1", CHAT, _chat(min_p=1.1), ["min_p"]),
    ("max_tokens zero", CHAT, _chat(max_tokens=0), ["max_tokens"]),
    ("max_completion_tokens zero", CHAT, _chat(max_completion_tokens=0), ["max_completion_tokens"]),
    ("xtc_probability above 1", CHAT, _chat(xtc_probability=2), ["xtc_probability"]),
    ("xtc_threshold negative", CHAT, _chat(xtc_threshold=-0.1), ["xtc_threshold"]),
    ("repetition_penalty negative", CHAT, _chat(repetition_penalty=-1), ["repetition_penalty"]),
    ("repetition_penalty tiny", CHAT, _chat(repetition_penalty=1e-320), ["repetition_penalty"]),
    ("repetition_penalty above 100", CHAT, _chat(repetition_penalty=101), ["repetition_penalty"]),
    ("presence_penalty below -2", CHAT, _chat(presence_penalty=-2.5), ["presence_penalty"]),
    ("frequency_penalty above 2", CHAT, _chat(frequency_penalty=1e308), ["frequency_penalty"]),
    ("logit_bias value huge", CHAT, _chat(logit_bias={"42": 1e11}), ["logit_bias", "42"]),
    (
        "repetition_context_size negative",
        CHAT,
        _chat(repetition_context_size=-1),
        ["repetition_context_size"],
    ),
    (
        "presence_context_size negative",
        CHAT,
        _chat(presence_context_size=-1),
        ["presence_context_size"],
    ),
    ("top_logprobs 12", CHAT, _chat(top_logprobs=12), ["top_logprobs"]),
    ("top_logprobs -2", CHAT, _chat(top_logprobs=-2), ["top_logprobs"]),
    ("logprobs 1", CHAT, _chat(logprobs=1), ["logprobs"]),
    ("stream string", CHAT, _chat(stream="yes"), ["stream"]),
    ("seed float", CHAT, _chat(seed=1.5), ["seed"]),
    ("logit_bias value string", CHAT, _chat(logit_bias={"42": "x"}), ["logit_bias", "42"]),
    ("stop number", CHAT, _chat(stop=5), ["stop"]),
    ("stop list of numbers", CHAT, _chat(stop=[5]), ["stop", 0]),
    ("n 17", CHAT, _chat(n=17), ["n"]),
    ("n 0", CHAT, _chat(n=0), ["n"]),
    ("user without content", CHAT, {"messages": [{"role": "user"}]}, ["messages", 0]),
    ("echo true", COMPLETION, {"prompt": "a", "echo": True}, ["echo"]),
    ("tool_choice unknown", CHAT, _chat(tool_choice="sometimes"), ["tool_choice"]),
    (
        "response_format unknown",
        CHAT,
        _chat(response_format={"type": "xml"}),
        ["response_format", "type"],
    ),
    (
        "json_schema without json_schema",
        CHAT,
        _chat(response_format={"type": "json_schema"}),
        ["response_format"],
    ),
    ("prompt missing", COMPLETION, {"max_tokens": 4}, []),
    ("prompt empty", COMPLETION, {"prompt": ""}, ["prompt"]),
    ("prompt several strings", COMPLETION, {"prompt": ["a", "b"]}, ["prompt"]),
    ("prompt several token arrays", COMPLETION, {"prompt": [[1], [2]]}, ["prompt"]),
    ("prompt negative token id", COMPLETION, {"prompt": [1, -1]}, ["prompt", 1]),
    ("prompt float token id", COMPLETION, {"prompt": [[1.5]]}, ["prompt", 0, 0]),
    ("completion temperature", COMPLETION, _completion(temperature=-1), ["temperature"]),
    ("completion top_logprobs", COMPLETION, _completion(top_logprobs=12), ["top_logprobs"]),
    ("completion logprobs int", COMPLETION, _completion(logprobs=5), ["logprobs"]),
]

ACCEPTED = [
    ("minimal chat", CHAT, _chat()),
    ("unknown fields", CHAT, _chat(frequency="x", metadata={"a": 1}, store=False)),
    ("extra message keys", CHAT, {"messages": [{"role": "user", "content": "hi", "x": 1}]}),
    ("temperature above OpenAI's cap", CHAT, _chat(temperature=3.5)),
    ("top_logprobs -1", CHAT, _chat(top_logprobs=-1)),
    ("top_logprobs 0", CHAT, _chat(top_logprobs=0)),
    ("top_logprobs 11", CHAT, _chat(top_logprobs=11, logprobs=True)),
    ("nullable fields", CHAT, _chat(max_tokens=None, seed=None, stop=None, stream_options=None)),
    ("stop list", CHAT, _chat(stop=["a", "b", "c", "d", "e"])),
    ("logit_bias", CHAT, _chat(logit_bias={"42": -5.0, "7": 1})),
    (
        "penalty extremes",
        CHAT,
        _chat(presence_penalty=-2, frequency_penalty=2, repetition_penalty=0),
    ),
    ("logit_bias ban idiom", CHAT, _chat(logit_bias={"2": -1e9, "7": 1e10})),
    ("developer role", CHAT, {"messages": [{"role": "developer", "content": "be brief"}, *USER]}),
    (
        "text parts",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    ),
    (
        "image and audio parts",
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
                        {"type": "text", "text": "what is this?"},
                    ],
                }
            ]
        },
    ),
    (
        "assistant tool call with null content, arguments string and object",
        CHAT,
        {
            "messages": [
                *USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "g", "arguments": {"b": 2}},
                        },
                    ],
                    "reasoning_content": "thinking",
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "1"},
            ]
        },
    ),
    (
        "tool_choice object",
        CHAT,
        _chat(tool_choice={"type": "function", "function": {"name": "f"}}),
    ),
    (
        "response_format json_schema",
        CHAT,
        _chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True},
            }
        ),
    ),
    ("chat_template_kwargs", CHAT, _chat(chat_template_kwargs={"enable_thinking": False})),
    ("reasoning_effort any string", CHAT, _chat(reasoning_effort="medium")),
    ("session ids", CHAT, _chat(session_id="s", prompt_cache_key="k", user="u", model="m")),
    ("minimal completion", COMPLETION, _completion()),
    ("completion sampling", COMPLETION, _completion(temperature=0, top_k=0, logprobs=True)),
    ("completion unknown fields", COMPLETION, _completion(echo=False, suffix=None)),
    ("prompt token ids", COMPLETION, {"prompt": [1, 2, 3]}),
    ("prompt one string in an array", COMPLETION, {"prompt": ["tok"]}),
    ("prompt one token-id array in an array", COMPLETION, {"prompt": [[0, 7]]}),
]


@pytest.mark.parametrize(
    ("schema_ptr", "body", "error_path"),
    [case[1:] for case in REJECTED],
    ids=[case[0] for case in REJECTED],
)
def test_request_schema_rejects(schema_ptr: str, body: Any, error_path: list[Any]) -> None:
    error = best_match(_validator(schema_ptr).iter_errors(body))
    assert error is not None, f"{body!r} was accepted"
    assert list(error.absolute_path) == error_path


@pytest.mark.parametrize(
    ("schema_ptr", "body"),
    [case[1:] for case in ACCEPTED],
    ids=[case[0] for case in ACCEPTED],
)
def test_request_schema_accepts(schema_ptr: str, body: Any) -> None:
    _validator(schema_ptr).validate(body)


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ("Health", {"status": "ok", "extra": 1}),
        ("Health", {"status": "unavailable"}),
        ("ChatCompletion", {"id": "x", "object": "chat.completion"}),
        ("ErrorResponse", {"error": {"message": "m"}}),
        ("Usage", {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "lane": "gpu"}),
        ("ChatCompletionSSEEvent", {"data": {"id": "chatcmpl-1"}}),
        ("ChatCompletionSSEEvent", {"event": "x"}),
    ],
)
def test_response_schema_rejects(schema: str, value: Any) -> None:
    assert not _validator(f"#/components/schemas/{schema}").is_valid(value)
