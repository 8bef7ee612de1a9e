"""Malformed multipart bodies on the audio routes: a 400 in OpenAI's error shape
naming the parser's reason, never a 500, and the server answers afterwards.

Connexion validates ``multipart/form-data`` by calling Starlette's form parser
itself, so the parser's ``MultiPartException`` (no boundary, a text field over
its 1 MiB part limit) reaches the app's error handler unwrapped. The tiny
server has no Whisper model: validation runs before the handler would say so.
"""

from __future__ import annotations

import httpx
import pytest

URL = "/v1/audio/transcriptions"


@pytest.mark.parametrize(
    ("headers", "content", "files", "data", "reason"),
    [
        (
            {"content-type": "multipart/form-data"},
            b"abc",
            None,
            None,
            "Missing boundary in multipart.",
        ),
        (
            None,
            None,
            {"file": ("a.wav", b"RIFF")},
            {"prompt": "word " * 300_000},  # 1.5 MB, over Starlette's 1 MiB part cap
            "Part exceeded maximum size of 1024KB.",
        ),
    ],
)
def test_a_malformed_multipart_body_is_a_400(
    client: httpx.Client,
    headers: dict | None,
    content: bytes | None,
    files: dict | None,
    data: dict | None,
    reason: str,
) -> None:
    r = client.post(URL, headers=headers, content=content, files=files, data=data)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": f"malformed multipart body: {reason}",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert client.get("/health").json() == {"status": "ok"}
