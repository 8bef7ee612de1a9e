"""Media decoding and the remote-media policy (``mlxspec.engine.media``), the
policy against real HTTP servers on loopback: a redirect hop checked again, the
opt-in flag, a body over the cap cut, a slow server timed out."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from mlxspec.engine.media import (
    FetchPolicy,
    MediaError,
    MediaUrlRejected,
    decode_image,
    fetch_media,
)
from mlxspec.engine.media.fetch import check_address
from mlxspec.engine.media.images import data_url_bytes

WHERE = "messages[0].content[0]"


def _encoded(fmt: str, frames: int = 1) -> bytes:
    colors = [(255, 0, 0), (0, 0, 255)]
    images = [Image.new("RGB", (20, 10), colors[i % 2]) for i in range(frames)]
    out = io.BytesIO()
    if frames > 1:
        images[0].save(out, fmt, save_all=True, append_images=images[1:])
    else:
        images[0].save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_every_listed_format_decodes_to_rgb(fmt: str) -> None:
    image = decode_image(_encoded(fmt))
    assert (image.mode, image.size) == ("RGB", (20, 10))
    r, g, b = image.getpixel((5, 5))
    assert r > 200 and b < 60  # the red it was drawn with (JPEG/WebP lossy)


def test_a_gif_gives_its_first_frame() -> None:
    image = decode_image(_encoded("GIF", frames=2))
    assert image.getpixel((5, 5))[0] > 200  # red, not the second frame's blue


def test_other_formats_are_named_as_unsupported() -> None:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "ICO")
    with pytest.raises(MediaError, match="unsupported or unrecognized image format") as err:
        decode_image(out.getvalue(), WHERE)
    assert err.value.param == WHERE


def test_data_urls_decode_base64_and_percent_encoding() -> None:
    assert data_url_bytes("data:image/png;base64,aGk=", WHERE) == b"hi"
    assert data_url_bytes("data:text/plain,h%69", WHERE) == b"hi"
    with pytest.raises(MediaError, match="malformed data: URL"):
        data_url_bytes("data:nocomma", WHERE)


@pytest.mark.parametrize(
    ("address", "private_ok", "why"),
    [
        ("127.0.0.1", False, "127.0.0.1 is a loopback address"),
        ("::1", False, "::1 is a loopback address"),
        ("10.1.2.3", False, "10.1.2.3 is a private address"),
        ("192.168.0.7", False, "192.168.0.7 is a private address"),
        ("169.254.169.254", False, "169.254.169.254 is a link-local address"),
        ("::ffff:127.0.0.1", False, "127.0.0.1 is a loopback address"),
        ("224.0.0.1", True, "224.0.0.1 is a multicast address"),
        ("0.0.0.0", True, "0.0.0.0 is not a routable address"),
        ("8.8.8.8", False, None),
        ("127.0.0.1", True, None),
        ("10.1.2.3", True, None),
    ],
)
def test_the_policy_decides_on_each_address(
    address: str, private_ok: bool, why: str | None
) -> None:
    reason = check_address(address, private_ok)
    assert reason is None if why is None else (reason or "").startswith(why)


def _serve(handler: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            handler(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _body(data: bytes, length: bool = True) -> Callable[[BaseHTTPRequestHandler], None]:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        if length:
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return send


@pytest.fixture()
def image_server() -> Iterator[str]:
    yield from _serve(_body(b"picture bytes"))


ALLOW = FetchPolicy(allow_private=True)


def test_loopback_is_refused_by_default_and_fetched_with_the_flag(image_server: str) -> None:
    with pytest.raises(MediaUrlRejected) as err:
        fetch_media(image_server + "/a.png", WHERE, FetchPolicy())
    assert err.value.message == (
        f"{WHERE}: media url rejected: 127.0.0.1 is a loopback address (start the server "
        "with --allow-private-media to allow it)"
    )
    assert fetch_media(image_server + "/a.png", WHERE, ALLOW) == b"picture bytes"


def _redirect(to: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return send


def test_every_redirect_hop_is_checked(image_server: str) -> None:
    # a hop to an address the flag never allows (multicast) is refused on the hop
    for url in _serve(_redirect("http://224.0.0.1/x.png")):
        with pytest.raises(MediaUrlRejected, match="224.0.0.1 is a multicast address"):
            fetch_media(url, WHERE, ALLOW)
    # a redirect to 127.0.0.1 is refused by default, followed with the flag
    for url in _serve(_redirect(image_server.replace("127.0.0.1", "localhost") + "/a.png")):
        assert fetch_media(url, WHERE, ALLOW) == b"picture bytes"
    for url in _serve(_redirect("http://127.0.0.1:9/a.png")):
        with pytest.raises(MediaUrlRejected, match="127.0.0.1 is a loopback address"):
            fetch_media(url, WHERE, FetchPolicy())


def test_a_body_over_the_cap_is_cut() -> None:
    small = FetchPolicy(allow_private=True, max_bytes=1000)
    for length in (True, False):  # declared, and streamed without a length
        for url in _serve(_body(b"x" * 5000, length=length)):
            with pytest.raises(MediaUrlRejected, match="the body is over the 1000-byte limit"):
                fetch_media(url, WHERE, small)


def _slow(h: BaseHTTPRequestHandler) -> None:
    time.sleep(2.0)
    try:
        _body(b"late")(h)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the client gave up first, as it should


def test_a_slow_server_times_out() -> None:
    quick = FetchPolicy(allow_private=True, connect_timeout=1.0, read_timeout=0.3)
    for url in _serve(_slow):
        start = time.monotonic()
        with pytest.raises(MediaUrlRejected, match="the fetch timed out"):
            fetch_media(url, WHERE, quick)
        assert time.monotonic() - start < 1.5


def test_other_schemes_and_statuses_are_rejected() -> None:
    with pytest.raises(MediaUrlRejected, match="only http and https URLs are fetched"):
        fetch_media("ftp://example.com/a.png", WHERE, ALLOW)

    def missing(h: BaseHTTPRequestHandler) -> None:
        h.send_response(404)
        h.send_header("Content-Length", "0")
        h.end_headers()

    for url in _serve(missing):
        with pytest.raises(MediaUrlRejected, match="the server answered 404"):
            fetch_media(url, WHERE, ALLOW)


def test_the_private_media_flag_and_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlxspec.cli.flags import parse_config

    monkeypatch.delenv("MLXSPEC_ALLOW_PRIVATE_MEDIA", raising=False)
    assert parse_config(["serve"]).allow_private_media is False
    assert parse_config(["serve", "--allow-private-media"]).allow_private_media is True
    monkeypatch.setenv("MLXSPEC_ALLOW_PRIVATE_MEDIA", "1")
    assert parse_config(["serve"]).allow_private_media is True
    monkeypatch.setenv("MLXSPEC_ALLOW_PRIVATE_MEDIA", "maybe")
    with pytest.raises(SystemExit) as err:
        parse_config(["serve"])
    assert err.value.code == 2
