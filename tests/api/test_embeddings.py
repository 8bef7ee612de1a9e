"""``POST /v1/embeddings`` on a tiny random Qwen3 embedding model.

Vectors are compared with a direct mlx-lm forward of the same folder
(``model.model`` hidden states, last token, L2-normalised); the official
``openai`` SDK is exercised with float and its default base64 encoding. Every
response is checked against the OpenAPI document.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import pytest

from fixtures.tiny_embedding import build_tiny_qwen3_embedding
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine.embedding import is_embedding_model, query_text
from mlxspec.handlers.embeddings.embeddings import encode_base64
from tests.conftest import LiveServer
from tests.helpers import openai_sdk

TEXTS = ["the cat sat on the mat", "hello"]


@pytest.fixture(scope="module")
def embedding_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_embedding(tmp_path_factory.mktemp("emb") / "tiny-qwen3")


@pytest.fixture(scope="module")
def embedding_server(embedding_dir: Path) -> Iterator[LiveServer]:
    from mlxspec.engine import Engine
    from mlxspec.http.app import create_app

    engine = Engine.load(embedding_dir, "tiny-qwen3-embedding")
    engine.start()
    with LiveServer(create_app(engine, validate_responses=True)) as server:
        yield server
    engine.close()


@pytest.fixture()
def emb_client(embedding_server: LiveServer) -> Iterator[httpx.Client]:
    with checking_client(embedding_server.base, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def reference(embedding_dir: Path):
    """Direct mlx-lm embedding: tokens, last-token pooled unit vector."""
    from mlx_lm import load

    model, tokenizer = load(str(embedding_dir))

    def embed(text: str) -> tuple[list[float], int]:
        tokens = tokenizer.encode(text)
        hidden = model.model(mx.array(tokens)[None])[0, -1].astype(mx.float32)
        return (hidden / mx.linalg.norm(hidden)).tolist(), len(tokens)

    return embed


def test_vectors_match_direct_forward(emb_client: httpx.Client, reference) -> None:
    r = emb_client.post("/v1/embeddings", json={"input": TEXTS, "model": "anything"})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = [reference(t) for t in TEXTS]
    assert body["object"] == "list"
    assert body["model"] == "tiny-qwen3-embedding"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    for row, (vector, _) in zip(body["data"], expected, strict=True):
        assert len(row["embedding"]) == 32
        assert row["embedding"] == pytest.approx(vector, abs=1e-5)
        assert math.sqrt(sum(x * x for x in row["embedding"])) == pytest.approx(1.0, abs=1e-5)
    tokens = sum(n for _, n in expected)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_models_row_says_embeddings(emb_client: httpx.Client, client: httpx.Client) -> None:
    embedding = emb_client.get("/v1/models").json()["data"][0]["capabilities"]
    chat = client.get("/v1/models").json()["data"][0]["capabilities"]
    assert (embedding["embeddings"], chat["embeddings"]) == (True, False)
    assert embedding["decisions"] is chat["decisions"] is True


def test_instruction_uses_qwen3_query_format(emb_client: httpx.Client, reference) -> None:
    assert query_text("cats", "Find pets") == "Instruct: Find pets\nQuery:cats"
    r = emb_client.post("/v1/embeddings", json={"input": "cats", "instruction": "Find pets"})
    assert r.status_code == 200, r.text
    vector, tokens = reference("Instruct: Find pets\nQuery:cats")
    assert r.json()["data"][0]["embedding"] == pytest.approx(vector, abs=1e-5)
    assert r.json()["usage"]["prompt_tokens"] == tokens


def test_openai_sdk_float_and_default_base64(embedding_server: LiveServer, reference) -> None:
    with openai_sdk(embedding_server.base) as sdk:
        floats = sdk.embeddings.create(model="m", input=TEXTS, encoding_format="float")
        default = sdk.embeddings.create(model="m", input=TEXTS)  # the SDK asks for base64
    for result in (floats, default):
        assert [d.index for d in result.data] == [0, 1]
        for row, text in zip(result.data, TEXTS, strict=True):
            assert row.embedding == pytest.approx(reference(text)[0], abs=1e-5)
    assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-7)
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0


def test_dimensions_keep_the_leading_values_normalised_again(
    emb_client: httpx.Client, embedding_server: LiveServer, reference
) -> None:
    full = reference(TEXTS[0])[0]
    norm = math.sqrt(sum(x * x for x in full[:8]))
    r = emb_client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 8})
    assert r.status_code == 200, r.text
    short = r.json()["data"][0]["embedding"]
    assert short == pytest.approx([x / norm for x in full[:8]], abs=1e-5)
    assert math.sqrt(sum(x * x for x in short)) == pytest.approx(1.0, abs=1e-5)
    whole = emb_client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 32})
    assert whole.json()["data"][0]["embedding"] == pytest.approx(full, abs=1e-5)
    # the SDK's default base64 encoding, shortened
    with openai_sdk(embedding_server.base) as sdk:
        got = sdk.embeddings.create(model="m", input=TEXTS, dimensions=8)
    assert [len(d.embedding) for d in got.data] == [8, 8]
    assert got.data[0].embedding == pytest.approx(short, abs=1e-6)


@pytest.mark.parametrize(
    ("dimensions", "message"),
    [
        (33, "dimensions must be at most 32 for this model (its embedding size), got 33"),
        (0, "Invalid value for 'dimensions': 0 is less than the minimum of 1"),
        (
            "8",
            "Invalid type for 'dimensions': expected an integer or null, but got a string instead.",
        ),
    ],
)
def test_bad_dimensions_are_400(emb_client: httpx.Client, dimensions, message) -> None:
    r = emb_client.post("/v1/embeddings", json={"input": "x", "dimensions": dimensions})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "dimensions"
    assert r.json()["error"]["message"] == message


def test_token_id_inputs_embed_as_given(emb_client: httpx.Client, reference, embedding_dir) -> None:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(embedding_dir)
    ids = [list(tokenizer.encode(t)) for t in TEXTS]
    one = emb_client.post("/v1/embeddings", json={"input": ids[0]})
    many = emb_client.post("/v1/embeddings", json={"input": ids, "dimensions": 4})
    assert one.status_code == many.status_code == 200, one.text + many.text
    assert one.json()["data"][0]["embedding"] == pytest.approx(reference(TEXTS[0])[0], abs=1e-5)
    assert one.json()["usage"]["prompt_tokens"] == len(ids[0])
    assert [len(d["embedding"]) for d in many.json()["data"]] == [4, 4]
    assert many.json()["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    # an instruction applies to text inputs only
    with_instruction = emb_client.post(
        "/v1/embeddings", json={"input": ids[0], "instruction": "Find pets"}
    )
    assert with_instruction.json()["data"] == one.json()["data"]


def test_token_ids_outside_the_vocabulary_are_400(emb_client: httpx.Client) -> None:
    r = emb_client.post("/v1/embeddings", json={"input": [[5, 6], [7, 10**6]]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input[1]"
    assert error["message"].startswith(f"input[1] token {10**6} is not a token id of this model")


def test_an_empty_instruction_is_no_instruction(emb_client: httpx.Client) -> None:
    plain = emb_client.post("/v1/embeddings", json={"input": "cats"}).json()
    empty = emb_client.post("/v1/embeddings", json={"input": "cats", "instruction": ""}).json()
    assert empty["data"] == plain["data"]
    assert empty["usage"] == plain["usage"]


def test_embedded_tokens_are_counted_in_metrics(emb_client: httpx.Client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    def counters() -> tuple[float, float]:
        text = emb_client.get("/metrics").text
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        return values["mlxspec_embedding_tokens_total"], values["mlxspec_prompt_tokens_total"]

    before = counters()
    ok = emb_client.post("/v1/embeddings", json={"input": TEXTS})
    refused = emb_client.post("/v1/embeddings", json={"input": ["ok", "a" * 300]})
    assert (ok.status_code, refused.status_code) == (200, 400)
    embedded, prompt = counters()
    # the usage it reported, in its own counter; a refused request embeds nothing
    assert embedded - before[0] == ok.json()["usage"]["prompt_tokens"] > 0
    assert prompt == before[1]  # generations' prompt tokens are another counter


def test_base64_is_little_endian_float32() -> None:
    assert encode_base64([1.0, -2.0]) == "AACAPwAAAMA="


MIXED = (
    "`input` mixes token ids with other inputs: send one list of token ids, or a list of "
    "texts and token-id lists"
)
SHAPE = (
    "`input` must be a string, an array of strings, an array of token ids or an array of "
    "token-id arrays"
)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": 5}, "input", SHAPE),
        ({"input": []}, "input", "`input` must not be empty"),
        ({"input": ["ok", 3]}, "input[1]", MIXED),
        ({"input": [["nested"]]}, "input[0][0]", SHAPE),
        ({"input": [[]]}, "input[0]", "`input` must not be empty"),
        ({"input": [1, "a"]}, "input[0]", MIXED),
        ({"input": ["a", [1], 2]}, "input[2]", MIXED),
        ({"input": [-1]}, "input[0]", SHAPE),
        ({"model": "m"}, "input", "input is required"),  # missing, not malformed
    ],
)
def test_bad_input_is_400(emb_client: httpx.Client, body, param, message) -> None:
    r = emb_client.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


TOO_MANY = "`input` holds more than 2048 inputs; send at most 2048 per request"


@pytest.mark.parametrize("item", ["a", [5]], ids=["texts", "token-id-lists"])
def test_more_than_2048_inputs_are_400(emb_client: httpx.Client, item) -> None:
    r = emb_client.post("/v1/embeddings", json={"input": [item] * 2049})
    assert r.status_code == 400, r.text[:200]
    assert r.json() == {
        "error": {
            "message": TOO_MANY,
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        }
    }
    # 2048 pass validation: the handler's later dimensions check (before any forward) answers
    full = emb_client.post("/v1/embeddings", json={"input": [item] * 2048, "dimensions": 33})
    assert (full.status_code, full.json()["error"]["param"]) == (400, "dimensions")


def test_one_token_id_list_is_one_input_whatever_its_length(emb_client: httpx.Client) -> None:
    # 2049 ids are one input: the context limit refuses it, not the 2048-input cap
    r = emb_client.post("/v1/embeddings", json={"input": [5] * 2049})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": "This model's maximum context length is 128 tokens, "
        "but the input has 2049 tokens.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }


def test_input_longer_than_the_context_is_400(emb_client: httpx.Client) -> None:
    r = emb_client.post("/v1/embeddings", json={"input": ["ok", "a" * 300]})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "message": "This model's maximum context length is 128 tokens, "
            "but the input has 300 tokens.",
            "type": "invalid_request_error",
            "param": "input[1]",
            "code": "context_length_exceeded",
        }
    }


def test_bad_encoding_format_is_400(emb_client: httpx.Client) -> None:
    r = emb_client.post("/v1/embeddings", json={"input": "x", "encoding_format": "int8"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "encoding_format"


def test_non_embedding_model_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "message": "model 'tiny-llama' is not an embedding model; serve an embedding "
            "model (e.g. Qwen3-Embedding) to use /v1/embeddings",
            "type": "invalid_request_error",
            "param": "model",
            "code": None,
        }
    }


def test_embedding_model_detection(tmp_path: Path) -> None:
    def folder(name: str, config: dict, *files: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        for file in files:
            (path / file).write_text("{}")
        return path

    causal = {"architectures": ["Qwen3ForCausalLM"]}
    assert not is_embedding_model(folder("chat", causal), "org/chat-model")
    assert is_embedding_model(folder("st", causal, "modules.json"), "org/st")
    assert is_embedding_model(folder("bare", {"architectures": ["Qwen3Model"]}), "org/bare")
    assert is_embedding_model(folder("named", causal), "Qwen/Qwen3-Embedding-0.6B")
