"""Transcription bodies -> options, the prompt budget, and the subtitle formats
(parsed back with the ``srt`` and ``webvtt-py`` packages)."""

from __future__ import annotations

import io

import pytest

from mlxspec.engine.audio import (
    FALLBACK_TEMPERATURES,
    PROMPT_TOKEN_BUDGET,
    Segment,
    TakeResult,
    VadOptions,
    fit_prompt,
)
from mlxspec.errors import ApiError
from mlxspec.handlers.audio.formats import json_body, srt, vtt
from mlxspec.handlers.audio.wire import audio_bytes, parse_language, to_options


def test_defaults_follow_mlx_whisper() -> None:
    o = to_options({}, task="transcribe")
    assert o.temperatures == FALLBACK_TEMPERATURES and o.beam_size is None
    assert o.language is None and o.no_speech_threshold == 0.6 and o.vad is None
    assert o.condition_on_previous_text and not o.word_timestamps


def test_fields() -> None:
    o = to_options(
        {"language": "French", "temperature": 0, "beam_size": 5, "vad": True, "vad_trim": True,
         "vad_threshold": 0.3, "timestamp_granularities[]": ["word"], "vocabulary": "MLX, Metal"},
        task="translate",
    )  # fmt: skip
    assert (o.task, o.language, o.temperatures, o.beam_size) == ("translate", "fr", (0.0,), 5)
    assert o.vad == VadOptions(threshold=0.3, min_speech_ms=250, trim=True)
    assert o.word_timestamps and o.vocabulary == ("MLX", "Metal")
    json_form = to_options(
        {"timestamp_granularities": ["word"], "vocabulary": ["a", " "]}, task="transcribe"
    )
    assert json_form.word_timestamps and json_form.vocabulary == ("a",)


@pytest.mark.parametrize(("given", "code"), [("en", "en"), ("auto", None), ("pt-BR", "pt"),
                                             ("japanese", "ja"), (None, None)])  # fmt: skip
def test_language_names(given: str | None, code: str | None) -> None:
    assert parse_language(given) == code


def test_refusals() -> None:
    with pytest.raises(ApiError, match="unknown language"):
        parse_language("klingon")
    with pytest.raises(ApiError, match="English-only"):
        parse_language("fr", multilingual=False)
    with pytest.raises(ApiError, match="cannot translate"):
        to_options({}, task="translate", multilingual=False)
    with pytest.raises(ApiError, match="temperature 0"):
        to_options({"beam_size": 2, "temperature": 0.2}, task="transcribe")
    with pytest.raises(ApiError, match="base64"):
        audio_bytes({"file": "!!"}, None)
    assert audio_bytes({"input_audio": {"data": "data:audio/wav;base64,AAEC"}}, None) == b"\0\1\2"


def test_prompt_keeps_its_last_tokens_and_vocabulary_fits_whole() -> None:
    from mlx_whisper.tokenizer import get_tokenizer

    tok = get_tokenizer(True, num_languages=99)
    long = " ".join(f"word{i}" for i in range(400))
    tokens, usage = fit_prompt(tok, long, ("SwiftUI",))
    assert len(tokens) == PROMPT_TOKEN_BUDGET and tok.decode(tokens).endswith("word399")
    assert usage is not None and usage.omitted == ("SwiftUI",)
    tokens, usage = fit_prompt(tok, "A talk about", ("Sotto", "SwiftUI", "Metal"))
    assert usage is not None and usage.included == ("Sotto", "SwiftUI", "Metal")
    assert tok.decode(tokens) == " A talk about, Sotto, SwiftUI, Metal"
    assert usage.token_count == len(tokens) and fit_prompt(tok, None, ())[1] is None


def _result() -> TakeResult:
    def seg(i: int, a: float, b: float, text: str) -> Segment:
        first = (text.split() or [""])[0]
        word = {"word": first, "start": a, "end": b, "probability": 0.9}
        return Segment(
            i, 0, a, b, text, (1, 2), 0.0, -0.2, 1.1, 0.01, words=(word,) if first else ()
        )

    segments = (seg(0, 0.0, 2.5, " Hello there."), seg(1, 2.5, 2.5, ""),
                seg(2, 3661.25, 3663.5, " An hour later."))  # fmt: skip
    return TakeResult(" Hello there. An hour later.", "en", 3664.0, segments)


def test_srt_and_vtt_parse() -> None:
    import srt as srt_lib
    import webvtt

    subs = list(srt_lib.parse(srt(_result())))
    assert [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs] == [
        (0.0, 2.5, "Hello there."), (3661.25, 3663.5, "An hour later."),
    ]  # fmt: skip
    reader = getattr(webvtt, "from_buffer", None) or webvtt.read_buffer
    cues = list(reader(io.StringIO(vtt(_result()))))
    assert [(c.start, c.end, c.text) for c in cues] == [
        ("00:00:00.000", "00:00:02.500", "Hello there."),
        ("01:01:01.250", "01:01:03.500", "An hour later."),
    ]


def test_verbose_json_shape() -> None:
    body = json_body(_result(), "whisper-base", 12.5, verbose=True)
    assert body["task"] == "transcribe" and len(body["segments"]) == 2  # the blank one is dropped
    assert [w["word"] for w in body["words"]] == ["Hello", "An"]
    assert body["mlxspec"]["timings"]["total_ms"] == 12.5
    assert set(json_body(_result(), "m", 1.0)) == {"text", "mlxspec"}


@pytest.mark.parametrize(
    ("media", "rate"),
    [
        ("audio/pcm", 16000),
        ("audio/pcm;rate=22050", 22050),
        ("audio/PCM; Rate = 8000 ; channels=1", 8000),
        ('audio/pcm;rate="44100"', 44100),
    ],
)
def test_pcm_rate(media: str, rate: int) -> None:
    from mlxspec.handlers.audio.sessions import pcm_rate

    assert pcm_rate(media) == rate


@pytest.mark.parametrize(
    "bad", ["abc", "-16000", "16000.5", "1e5", "", "١٦٠٠٠", "9" * 5000, "99999999999"]
)
def test_pcm_rate_that_is_not_a_whole_number_is_a_400(bad: str) -> None:
    from mlxspec.handlers.audio.sessions import pcm_rate

    with pytest.raises(ApiError) as caught:
        pcm_rate(f"audio/pcm;rate={bad}")
    assert caught.value.status == 400 and caught.value.kind == "invalid_audio"
    assert "is not a whole number of Hz from 4000 to 768000" in caught.value.message


@pytest.mark.parametrize("rate", [1, 3999, 768001, 999999999])
def test_pcm_rate_out_of_range_is_a_400_not_a_413(rate: int) -> None:
    """A whole rate outside the bounds is refused before a length is computed from
    it (``rate=1`` made a 40 kB chunk "10000 s long": a 413, fresh-user pass)."""
    from mlxspec.handlers.audio.sessions import pcm_rate

    with pytest.raises(ApiError) as caught:
        pcm_rate(f"audio/pcm;rate={rate}")
    assert caught.value.status == 400 and caught.value.kind == "invalid_audio"
    assert f"rate {rate} Hz is outside 4000-768000 Hz" in caught.value.message

