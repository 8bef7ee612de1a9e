"""Rows with media in the continuous batch, on a tiny random Qwen2.5-VL
(``fixtures/tiny_vlm.py``): prefilled on the vision wing a step at a time, then
decoded beside text rows. A media row's greedy tokens are ``mlx_vlm.generate``'s
in a batch of four mixed with text rows (two images of different sizes: their
mRoPE shifts differ), the text rows' are their own alone, and a video's prefill
lets a streaming row take a token between any two of its chunks."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from fixtures.tiny_vlm import build_tiny_vlm
from mlxspec.engine import Delta, Engine, Finished, GenerationRequest, LogitsParams
from tests.api.test_vision import PROMPT, _data_url, _mp4, _png

TOKENS = 8
#: No early end-of-sequence, so every row runs its whole budget.
NO_EOS = LogitsParams(logit_bias=((0, -1e9), (1, -1e9), (2, -1e9)))


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen-vl")


@pytest.fixture(scope="module")
def engine(vlm_dir: Path) -> Any:
    engine = Engine.load(vlm_dir, "tiny-qwen-vl", prefill_step=8, prompt_cache_bytes=0)
    engine.start()
    yield engine
    engine.close()


def _image_messages(size: tuple[int, int], seed: int) -> list[dict]:
    content = [
        {"type": "image_url", "image_url": {"url": _data_url(_png(seed, size))}},
        {"type": "text", "text": PROMPT},
    ]
    return [{"role": "user", "content": content}]


def _request(engine: Engine, messages: list[dict], max_tokens: int = TOKENS) -> GenerationRequest:
    prompt = engine.chat_prompt(messages)
    media = getattr(prompt, "media", None)  # logprobs: every token gets an event
    return GenerationRequest(tuple(prompt), max_tokens, logprobs=True, media=media)


async def _collect(handle: Any) -> tuple[list[int], Finished]:
    ids, fin = [], None
    async for ev in handle:
        if isinstance(ev, Delta):
            ids += ev.token_ids
        elif isinstance(ev, Finished):
            fin = ev
    assert fin is not None
    return ids, fin


def _together(engine: Engine, requests: list[GenerationRequest]) -> list[tuple[list[int], Any]]:
    """Submit every request in one event-loop turn (the engine takes them in one
    loop turn, so they start in the batch together) and collect them."""

    async def go() -> list[tuple[list[int], Any]]:
        handles = [engine.submit(r) for r in requests]
        return list(await asyncio.gather(*(_collect(h) for h in handles)))

    return asyncio.run(go())


def _mlx_vlm_tokens(vlm_dir: Path, size: tuple[int, int], seed: int) -> list[int]:
    import mlx_vlm
    from PIL import Image

    model, processor = mlx_vlm.load(str(vlm_dir))
    prompt = mlx_vlm.apply_chat_template(processor, model.config, PROMPT, num_images=1)
    image = Image.open(io.BytesIO(_png(seed, size))).convert("RGB")
    ref = mlx_vlm.generate(
        model, processor, prompt, image=[image], max_tokens=TOKENS, temperature=0.0
    )
    return list(ref.token_ids)


def _in_one_lane(engine: Engine, requests: list[GenerationRequest]) -> tuple[list, int]:
    """Run ``requests`` in one batch of four on the engine thread, all added at
    once; their outputs and the most rows that got a token in one step."""
    from mlxspec.engine.loop.batching import BatchLane
    from mlxspec.engine.loop.handles import RequestHandle

    async def go() -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        handles = [RequestHandle(r, loop) for r in requests]

        def work() -> int:
            lane = BatchLane(engine.lane_parts, 4, on_done=lambda _h, _o: None)
            for handle in handles:
                lane.add(handle, handle.request.max_tokens)
            most = 0
            while len(lane):
                routed = lane.times.rows
                lane.step()
                most = max(most, lane.times.rows - routed)
            lane.close()
            return most

        most = await engine.run_exclusive(work)
        return list(await asyncio.gather(*(_collect(h) for h in handles))), most

    return asyncio.run(go())


def test_media_rows_in_a_batch_of_four_give_mlx_vlm_generate_tokens(
    engine: Engine, vlm_dir: Path
) -> None:
    sizes = [((100, 80), 0), ((56, 56), 1)]  # 12 and 4 patch tokens: two mRoPE shifts
    texts = ["the quick brown fox jumps over the lazy dog", "hello there"]
    text_requests = [
        GenerationRequest(
            prompt=tuple(engine.chat_prompt([{"role": "user", "content": t}])),
            max_tokens=3 * TOKENS,  # still decoding when the media rows join
            logits=NO_EOS,
            logprobs=True,
        )
        for t in texts
    ]
    alone = [_together(engine, [r])[0][0] for r in text_requests]
    media = [_request(engine, _image_messages(size, seed)) for size, seed in sizes]
    assert all(r.media is not None for r in media)
    out, most = _in_one_lane(engine, [media[0], text_requests[0], media[1], text_requests[1]])
    assert most == 4  # the four rows decoded together
    assert [fin.lane for _, fin in out] == ["batched"] * 4
    expected = [_mlx_vlm_tokens(vlm_dir, size, seed) for size, seed in sizes]
    assert out[0][0] == expected[0]
    assert out[2][0] == expected[1]
    assert [out[1][0], out[3][0]] == alone
    # through the engine, alone and beside a text row, a media row is mlx_vlm.generate's too
    assert _together(engine, [media[1]])[0] == (expected[1], _together(engine, [media[1]])[0][1])
    both = _together(engine, [text_requests[0], media[0]])
    assert (both[0][0], both[1][0]) == (alone[0], expected[0])
    assert both[1][1].lane == "batched"


def test_a_video_prefill_lets_a_streaming_row_decode_between_its_chunks(
    engine: Engine, tmp_path: Path
) -> None:
    from mlxspec.engine.loop.batching import BatchLane
    from mlxspec.engine.loop.handles import RequestHandle

    clip = _data_url(_mp4(tmp_path / "clip.mp4", frames=16), "video/mp4")
    video = [
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": clip}},
                {"type": "text", "text": "What happens?"},
            ],
        }
    ]
    video_request = _request(engine, video, max_tokens=4)
    assert video_request.media is not None
    chunks = -(-(len(video_request.prompt) - 1) // 8)
    assert chunks >= 4  # long enough to stall a streaming row if it ran whole
    text = GenerationRequest(
        prompt=tuple(engine.tokenizer.encode("count with me")), max_tokens=60, logits=NO_EOS
    )
    ended: list[str] = []

    async def go() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        streaming, prefilled = RequestHandle(text, loop), RequestHandle(video_request, loop)

        def work() -> list[tuple[int, int]]:
            parts = engine.lane_parts
            lane = BatchLane(parts, 4, on_done=lambda _h, outcome: ended.append(outcome))
            lane.add(streaming, 60)
            while not lane.batch.slots[0].row.count:
                lane.step()
            lane.add(prefilled, 4)
            work = lane.media[0]
            trace = []  # per step: (tokens the streaming row got, media prefill steps taken)
            while lane.media:
                row = lane.batch.slots[0].row
                count, taken = row.count, work.steps
                lane.step()
                trace.append((row.count - count, work.steps - taken))
            while len(lane):
                lane.step()
            lane.close()
            return trace

        trace = await engine.run_exclusive(work)
        await asyncio.gather(_collect(streaming), _collect(prefilled))
        return trace

    trace = asyncio.run(go())
    assert ended == ["completed", "completed"]
    # one embedding step, then a chunk of 8 prompt tokens per step
    assert sum(taken for _, taken in trace) == 1 + chunks
    assert all(taken <= 1 for _, taken in trace)
    # the streaming row got its token in every step a media chunk ran
    assert [got for got, taken in trace if taken] == [1] * (1 + chunks)


def test_a_follow_up_about_the_same_image_reuses_its_kv_and_no_other_image_does(
    engine: Engine, vlm_dir: Path
) -> None:
    cached = Engine.load(vlm_dir, "tiny-qwen-vl", prefill_step=8)
    cached.start()
    try:
        first = _image_messages((100, 80), 5)
        ids, fin = _together(cached, [_request(cached, first)])[0]
        assert fin.cached_tokens == 0
        follow = [
            *first,
            {"role": "assistant", "content": cached.tokenizer.decode(ids)},
            {"role": "user", "content": "And the colours?"},
        ]
        again = _request(cached, follow)
        ids2, fin2 = _together(cached, [again])[0]
        # the kept turn covers at least the first prompt, image tokens included
        assert fin2.cached_tokens >= len(_request(cached, first).prompt)
        assert (ids2, fin2.prompt_tokens) == (
            _together(engine, [_request(engine, follow)])[0][0],  # no prompt cache there
            len(again.prompt),
        )
        # another image of the same size: the same token ids, never the kept KV
        other = _request(cached, _image_messages((100, 80), 6))
        assert other.prompt == _request(cached, first).prompt
        assert _together(cached, [other])[0][1].cached_tokens == 0
    finally:
        cached.close()
