"""Images in, on a tiny random Qwen2.5-VL (``fixtures/tiny_vlm.py``, byte-level
tokenizer) served in-process: discovery says ``vision``, chat / Messages /
Responses image parts reach mlx-vlm's processor and model, a greedy answer is
``mlx_vlm.generate``'s token for token, and bad images are 400s naming the
problem while the server keeps serving."""

from __future__ import annotations

import base64
import io
import struct
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from fixtures.tiny_vlm import build_tiny_vlm
from mlxspec.conformance.httpx_checks import checking_client
from tests.conftest import LiveServer

PROMPT = "Describe this image."
TOKENS = 6


def _png(seed: int = 0, size: tuple[int, int] = (100, 80)) -> bytes:
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def _chat_body(url: str, **extra: object) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPT}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS}
    return {**body, "temperature": 0, **extra}


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen-vl")


@pytest.fixture(scope="module")
def vlm_engine(vlm_dir: Path) -> Iterator[object]:
    from mlxspec.engine import Engine

    engine = Engine.load(vlm_dir, "tiny-qwen-vl")
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def vlm_server(vlm_engine: object) -> Iterator[LiveServer]:
    from mlxspec.http.app import create_app

    with LiveServer(create_app(vlm_engine, validate_responses=True)) as server:
        yield server


@pytest.fixture()
def vclient(vlm_server: LiveServer) -> Iterator[httpx.Client]:
    with checking_client(vlm_server.base, timeout=120) as c:
        yield c


def test_discovery_says_the_model_takes_images(vclient: httpx.Client, vlm_engine: object) -> None:
    from mlx.utils import tree_flatten

    from mlxspec.engine.model.fit import model_memory

    row = vclient.get("/v1/models").json()["data"][0]
    assert (row["vision"], row["audio"]) == (True, False)
    assert (row["capabilities"]["vision"], row["capabilities"]["audio"]) == (True, False)
    fit = vclient.get("/fit").json()
    assert (fit["vision"], fit["audio"]) == (True, False)
    # the weights count the vision tower; the language weights once (shared)
    assert vlm_engine.vision.shared
    tower = sum(
        v.nbytes for _, v in tree_flatten(vlm_engine.vision.model.vision_tower.parameters())
    )
    text = model_memory(vlm_engine.model).weights_bytes
    assert tower > 0
    assert fit["report"]["weights_bytes"] == text + tower


def test_chat_image_answer_is_mlx_vlm_generate_greedy(vclient: httpx.Client, vlm_dir: Path) -> None:
    from PIL import Image

    r = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png())))
    assert r.status_code == 200, r.text
    body = r.json()
    import mlx_vlm

    model, processor = mlx_vlm.load(str(vlm_dir))
    prompt = mlx_vlm.apply_chat_template(processor, model.config, PROMPT, num_images=1)
    image = Image.open(io.BytesIO(_png())).convert("RGB")
    ref = mlx_vlm.generate(
        model, processor, prompt, image=[image], max_tokens=TOKENS, temperature=0.0
    )
    assert body["choices"][0]["message"]["content"] == processor.tokenizer.decode(ref.token_ids)
    assert body["usage"]["completion_tokens"] == len(ref.token_ids) == TOKENS
    # the prompt counts every image patch token (100x80 -> 112x84 pixels, 8x6 patches / 4)
    assert body["usage"]["prompt_tokens"] == ref.prompt_tokens
    assert ref.prompt_tokens > len(processor.tokenizer.encode(prompt)) + 10
    assert body["usage"]["lane"] == "batched"


def test_another_image_gives_another_answer(vclient: httpx.Client) -> None:
    a = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png(0)))).json()
    b = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png(1)))).json()
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]


def test_image_alias_messages_and_responses_give_the_chat_answer(vclient: httpx.Client) -> None:
    data = _png(2)
    chat = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(data))).json()
    expected = chat["choices"][0]["message"]["content"]
    alias = {"type": "image", "image": _data_url(data)}
    body = _chat_body("x")
    body["messages"][0]["content"][0] = alias
    r = vclient.post("/v1/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] == expected
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    block = {"type": "image", "source": source}
    messages = {
        "model": "tiny-qwen-vl",
        "max_tokens": TOKENS,
        "temperature": 0,
        "messages": [{"role": "user", "content": [block, {"type": "text", "text": PROMPT}]}],
    }
    r = vclient.post("/v1/messages", json=messages)
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == expected
    counted = vclient.post("/v1/messages/count_tokens", json=messages).json()
    assert counted["input_tokens"] == chat["usage"]["prompt_tokens"]
    parts = [
        {"type": "input_image", "image_url": _data_url(data)},
        {"type": "input_text", "text": PROMPT},
    ]
    responses = {
        "input": [{"role": "user", "content": parts}],
        "max_output_tokens": TOKENS,
        "temperature": 0,
        "store": False,
    }
    r = vclient.post("/v1/responses", json=responses)
    assert r.status_code == 200, r.text
    assert r.json()["output"][-1]["content"][0]["text"] == expected


def test_an_image_inside_a_tool_result_reaches_the_model(
    vclient: httpx.Client, vlm_engine: object
) -> None:
    source = {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(_png(3)).decode(),
    }

    def turn(image: dict) -> dict:
        return {
            "model": "tiny-qwen-vl",
            "max_tokens": TOKENS,
            "temperature": 0,
            "messages": [
                {"role": "user", "content": "Take a screenshot."},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [image]},
                        {"type": "text", "text": PROMPT},
                    ],
                },
            ],
        }

    with_image = vclient.post(
        "/v1/messages/count_tokens", json=turn({"type": "image", "source": source})
    )
    assert with_image.status_code == 200, with_image.text
    without = vclient.post(
        "/v1/messages/count_tokens", json=turn({"type": "text", "text": "done"})
    ).json()
    # the image's patch tokens are in the prompt: 100x80 pixels resize to 112x84, 8x6
    # patches of 14 merged 2x2 = 12 tokens, between <|vision_start|> and <|vision_end|>
    done = len(vlm_engine.tokenizer.encode("done", add_special_tokens=False))
    assert with_image.json()["input_tokens"] - without["input_tokens"] == 12 + 2 - done
    r = vclient.post("/v1/messages", json=turn({"type": "image", "source": source}))
    assert r.status_code == 200, r.text


def _forged_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` over one tiny IDAT."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _zip() -> bytes:
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("a.txt", "not an image")
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "kind", "says"),
    [
        (_png()[:120], "image/png", "image could not be decoded"),
        (_zip(), "image/png", "unsupported or unrecognized image format"),
        (_forged_png(30000, 30000), "image/png", "image is a decompression bomb (Image size"),
        (_forged_png(9000, 9000), "image/png", "image is 9000x9000 pixels, over the 67108864"),
        (b"GIF89a" + b"\0" * 10, "image/gif", "unsupported or unrecognized image format"),
    ],
    ids=["truncated-png", "zip-named-png", "30000x30000", "9000x9000", "broken-gif"],
)
def test_bad_images_are_400s_naming_the_problem(
    vclient: httpx.Client, data: bytes, kind: str, says: str
) -> None:
    r = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(data, kind)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith(f"messages[0].content[0]: {says}"), error
    assert error["param"] == "messages[0].content[0]"
    ok = vclient.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert ok.status_code == 200  # still serving


def test_bad_base64_and_schemes_are_400s(vclient: httpx.Client) -> None:
    r = vclient.post("/v1/chat/completions", json=_chat_body("data:image/png;base64,@@@"))
    assert r.status_code == 400 and "invalid base64" in r.json()["error"]["message"]
    r = vclient.post("/v1/chat/completions", json=_chat_body("file:///etc/passwd"))
    assert r.status_code == 400
    assert "media url rejected: scheme 'file' is not allowed" in r.json()["error"]["message"]


def _mp4(path: Path, frames: int = 8, fps: int = 4, fmt: str | None = None) -> bytes:
    """A short random-noise clip (mpeg4, in mp4 unless ``fmt``) written with PyAV."""
    import av

    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        out.start_encoding()
        rng = np.random.RandomState(0)
        for _ in range(frames):
            pixels = (rng.rand(48, 64, 3) * 255).astype("uint8")
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path.read_bytes()


def _video_body(url: str) -> dict:
    content = [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": "What happens?"},
    ]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": TOKENS,
        "temperature": 0,
    }


def test_video_answer_is_mlx_vlm_generate_greedy(
    vclient: httpx.Client, vlm_dir: Path, tmp_path: Path
) -> None:
    clip = tmp_path / "clip.mp4"
    r = vclient.post("/v1/chat/completions", json=_video_body(_data_url(_mp4(clip), "video/mp4")))
    assert r.status_code == 200, r.text
    import mlx_vlm

    model, processor = mlx_vlm.load(str(vlm_dir))
    video = [{"type": "video"}, {"type": "text", "text": "What happens?"}]
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": video}], tokenize=False, add_generation_prompt=True
    )
    # mlx-vlm reads the file with OpenCV at 2 fps: 8 frames at 4 fps sample 4, two
    # temporal patches of 2x2 merged 4x3 patches... the prompt counts them all
    ref = mlx_vlm.generate(
        model, processor, prompt, video=[str(clip)], max_tokens=TOKENS, temperature=0.0
    )
    body = r.json()
    assert body["choices"][0]["message"]["content"] == processor.tokenizer.decode(ref.token_ids)
    assert body["usage"]["prompt_tokens"] == ref.prompt_tokens
    assert ref.prompt_tokens > len(processor.tokenizer.encode(prompt)) + 4


def test_bad_videos_and_audio_parts_are_400s(vclient: httpx.Client, tmp_path: Path) -> None:
    empty = _mp4(tmp_path / "empty.avi", frames=0, fmt="avi")  # a video stream, no frame
    r = vclient.post("/v1/chat/completions", json=_video_body(_data_url(empty, "video/avi")))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "messages[0].content[0]: the video has no frames"
    r = vclient.post(
        "/v1/chat/completions", json=_video_body(_data_url(b"not a video", "video/mp4"))
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "messages[0].content[0]: video could not be decoded"
    )
    # no mlx-vlm class of a served family takes audio here: every audio shape is a 400
    for part in (
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "audio", "data": "UklGRg=="},
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,UklGRg=="}},
    ):
        body = _chat_body("x")
        body["messages"][0]["content"][0] = part
        r = vclient.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        assert r.json()["error"] == {
            "message": f"model tiny-qwen-vl does not take '{part['type']}' content parts "
            "(it takes: vision, video)",
            "type": "invalid_request_error",
            "param": "messages[0].content[0]",
            "code": None,
        }
    block = {"type": "audio", "source": {"type": "base64", "media_type": "audio/wav", "data": ""}}
    r = vclient.post(
        "/v1/messages",
        json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]},
    )
    assert r.status_code == 400
    assert "send audio to /v1/chat/completions" in r.json()["error"]["message"]
    ok = vclient.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert ok.status_code == 200  # still serving


class _Image(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        data = _png(4)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_image_urls_on_loopback_need_the_flag(vclient: httpx.Client, vlm_engine: object) -> None:
    from mlxspec.engine import FetchPolicy

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Image)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/shot.png"
    try:
        r = vclient.post("/v1/chat/completions", json=_chat_body(url))
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith(
            "messages[0].content[0]: media url rejected: 127.0.0.1 is a loopback address"
        )
        vlm_engine.media_policy = FetchPolicy(allow_private=True)  # --allow-private-media
        fetched = vclient.post("/v1/chat/completions", json=_chat_body(url))
        inline = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png(4))))
        assert fetched.status_code == 200, fetched.text
        assert fetched.json()["choices"] == inline.json()["choices"]
    finally:
        vlm_engine.media_policy = FetchPolicy()
        server.shutdown()
        server.server_close()


def test_text_requests_on_the_vision_model_use_the_text_path(vclient: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    r = vclient.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_decisions_with_images_are_refused_not_scored_blind(vclient: httpx.Client) -> None:
    body = {
        "model": "tiny-qwen-vl",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": _data_url(_png())}],
            }
        ],
        "questions": [{"type": "predicate", "name": "cat", "instructions": "A cat?"}],
    }
    r = vclient.post("/v1/decisions", json=body)
    assert r.status_code == 400, r.text
    assert "decision questions with images are not scored yet" in r.json()["error"]["message"]


def test_a_vlm_without_the_extra_is_a_start_up_error_naming_it(
    vlm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from fixtures.tiny_model import build_tiny_llama
    from mlxspec.engine.model.loader import ModelLoadError
    from mlxspec.engine.model.vision import load_vision

    monkeypatch.setitem(sys.modules, "mlx_vlm", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "mlx_vlm.utils", None)
    with pytest.raises(ModelLoadError) as err:
        load_vision(vlm_dir, None)
    assert str(err.value) == (
        f"{vlm_dir} is a vision-language model (qwen2_5_vl): serving it needs mlx-vlm, "
        "the vision extra (pip install 'mlxspec[vision]')"
    )
    assert load_vision(build_tiny_llama(tmp_path / "text"), None) is None  # text: no mlx-vlm


def test_the_official_sdks_send_images_as_base64_and_url(
    vlm_server: LiveServer, vclient: httpx.Client, vlm_engine: object
) -> None:
    from mlxspec.engine import FetchPolicy
    from tests.helpers import anthropic_sdk, openai_sdk

    data = _png(4)
    expected = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(data))).json()
    expected_text = expected["choices"][0]["message"]["content"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Image)  # serves _png(4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/shot.png"
    vlm_engine.media_policy = FetchPolicy(allow_private=True)
    try:
        with openai_sdk(vlm_server.base) as sdk:
            for source in (_data_url(data), url):
                reply = sdk.chat.completions.create(
                    model="tiny-qwen-vl",
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "image_url",
                                    "image_url": {"url": source, "detail": "low"},
                                },
                                {"type": "text", "text": PROMPT},
                            ],
                        }
                    ],
                    max_tokens=TOKENS,
                    temperature=0,
                )
                assert reply.choices[0].message.content == expected_text
        with anthropic_sdk(vlm_server.base) as sdk:
            b64 = base64.b64encode(data).decode()
            for source in (
                {"type": "base64", "media_type": "image/png", "data": b64},
                {"type": "url", "url": url},
            ):
                message = sdk.messages.create(  # greedy: the model has no sampling defaults
                    model="tiny-qwen-vl",
                    max_tokens=TOKENS,
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {"type": "image", "source": source},
                                {"type": "text", "text": PROMPT},
                            ],
                        }
                    ],
                )
                assert message.content[0].text == expected_text
    finally:
        vlm_engine.media_policy = FetchPolicy()
        server.shutdown()
        server.server_close()


def test_the_same_image_again_reuses_the_towers_output(vclient: httpx.Client) -> None:
    def objects() -> tuple[int, int]:
        cache = vclient.get("/stats").json()["prompt_cache"]
        return cache["object_hits"], cache["object_misses"]

    hits, misses = objects()
    body = _chat_body(_data_url(_png(7)))
    first = vclient.post("/v1/chat/completions", json=body).json()
    assert objects() == (hits, misses + 1)
    body["messages"].append({"role": "assistant", "content": "ok"})  # a follow-up turn
    body["messages"].append({"role": "user", "content": "And the colours?"})
    vclient.post("/v1/chat/completions", json=body)
    assert objects() == (hits + 1, misses + 1)
    again = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png(7)))).json()
    assert objects() == (hits + 2, misses + 1)
    assert again["choices"] == first["choices"]  # the cached features give the same answer
    vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png(8))))
    assert objects() == (hits + 2, misses + 2)


def test_two_images_are_taken_and_images_with_video_refused(
    vclient: httpx.Client, tmp_path: Path
) -> None:
    one = vclient.post("/v1/chat/completions", json=_chat_body(_data_url(_png(5)))).json()
    body = _chat_body(_data_url(_png(5)))
    body["messages"][0]["content"].insert(
        0, {"type": "image_url", "image_url": {"url": _data_url(_png(6))}}
    )
    two = vclient.post("/v1/chat/completions", json=body)
    assert two.status_code == 200, two.text
    # each 100x80 image adds 12 patch tokens and its two markers
    assert two.json()["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"] + 14
    video = {
        "type": "video_url",
        "video_url": {"url": _data_url(_mp4(tmp_path / "c.mp4"), "video/mp4")},
    }
    body["messages"][0]["content"][0] = video
    r = vclient.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert (
        r.json()["error"]["message"]
        == "image and video content parts cannot be combined in one request"
    )


def test_a_request_with_media_and_adapters_is_refused(vlm_engine: object) -> None:
    import asyncio

    from mlxspec.engine import EngineRequestError, GenerationRequest

    content = [{"type": "image_url", "image_url": {"url": _data_url(_png())}}]
    prompt = vlm_engine.chat_prompt([{"role": "user", "content": content}])
    request = GenerationRequest(prompt=tuple(prompt), media=prompt.media, adapter=("style",))

    async def submit() -> None:
        vlm_engine.submit(request)

    with pytest.raises(
        EngineRequestError, match="LoRA adapters do not apply to requests with media"
    ):
        asyncio.run(submit())


def test_a_streamed_image_answer_adds_up_to_the_whole_one(vclient: httpx.Client) -> None:
    import json

    body = _chat_body(_data_url(_png(9)))
    whole = vclient.post("/v1/chat/completions", json=body).json()
    text = []
    with vclient.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice["delta"].get("content") or "")
    assert "".join(text) == whole["choices"][0]["message"]["content"]


def test_a_gemma3_style_model_answers_as_mlx_vlm_generate(tmp_path: Path) -> None:
    """The wing is not Qwen-only: a SigLIP/Gemma-3-style model (fixed-size images,
    pooled soft tokens, no encoder cache) gives mlx-vlm's greedy answer."""
    import mlx_vlm
    from PIL import Image

    from mlxspec.engine import Engine
    from mlxspec.http.app import create_app

    folder = build_tiny_vlm(tmp_path / "tiny-gemma3", family="gemma3")
    engine = Engine.load(folder, "tiny-gemma3")
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=120) as c:
                assert c.get("/v1/models").json()["data"][0]["vision"] is True
                r = c.post("/v1/chat/completions", json=_chat_body(_data_url(_png(1))))
    finally:
        engine.close()
    assert r.status_code == 200, r.text
    model, processor = mlx_vlm.load(str(folder))
    content = [{"type": "image"}, {"type": "text", "text": PROMPT}]
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    image = Image.open(io.BytesIO(_png(1))).convert("RGB")
    ref = mlx_vlm.generate(
        model, processor, prompt, image=[image], max_tokens=TOKENS, temperature=0.0
    )
    body = r.json()
    assert body["choices"][0]["message"]["content"] == processor.tokenizer.decode(ref.token_ids)
    assert body["usage"]["prompt_tokens"] == ref.prompt_tokens
