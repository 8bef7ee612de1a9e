"""Image bytes to a Pillow image, with the checks a client's bytes need.

Formats: PNG, JPEG, WebP, GIF (its first frame), BMP and TIFF (reference, chat
request body: HEIC/AVIF need OS codecs and are refused here, docs/deviations.md).
Anything else, a truncated file, a declared size over :data:`MAX_IMAGE_PIXELS`
or a decompression bomb is a :class:`MediaError` (a 400 naming the problem);
Pillow reads the header first, so a 30000x30000 declaration is refused before
any pixel is decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from typing import Any

from mlxspec.engine.types import PromptError

__all__ = ["FORMATS", "MAX_IMAGE_PIXELS", "MediaError", "decode_image", "load_image_source"]

#: Pillow format names taken, by the name the error shows.
FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff"}
#: Most pixels a declared image may have (about 8192 x 8192); more is refused
#: before decoding (a 30000x30000 header, a decompression bomb).
MAX_IMAGE_PIXELS = 8192 * 8192
#: Largest media body, decoded from ``data:`` or fetched (reference: 64 MB).
MAX_MEDIA_BYTES = 64 * 1024 * 1024

_DATA_URL = re.compile(
    r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?)(;base64)?,", re.I
)


class MediaError(PromptError):
    """A media part the server cannot use (400 ``invalid_request_error``)."""


def decode_image(data: bytes, where: str = "image") -> Any:
    """Decode image bytes into an RGB Pillow image.

    Args:
        data (bytes): the file's bytes.
        where (str): the part named in errors, e.g. ``messages[0].content[1]``.
            Default: ``"image"``.

    Returns:
        PIL.Image.Image: RGB, fully decoded (GIF: its first frame).

    Raises:
        MediaError: not one of :data:`FORMATS`, truncated or corrupt, or over
            :data:`MAX_IMAGE_PIXELS`.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(FORMATS))
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise MediaError(
                    f"{where}: image is {width}x{height} pixels, over the "
                    f"{MAX_IMAGE_PIXELS}-pixel limit",
                    param=where,
                )
            image.seek(0)
            image.load()
            return image.convert("RGB")
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError(
            f"{where}: unsupported or unrecognized image format (expected "
            f"{', '.join(FORMATS.values())})",
            param=where,
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise MediaError(f"{where}: image is a decompression bomb ({e})", param=where) from None
    except (OSError, ValueError, SyntaxError) as e:
        raise MediaError(f"{where}: image could not be decoded ({e})", param=where) from None


def data_url_bytes(url: str, where: str, cap: int = MAX_MEDIA_BYTES) -> bytes:
    """The bytes of a ``data:`` URL (base64 or percent-encoded), capped at
    ``cap`` bytes (default :data:`MAX_MEDIA_BYTES`).

    Raises:
        MediaError: not a data URL, invalid base64, or over the cap.
    """
    match = _DATA_URL.match(url)
    if match is None:
        raise MediaError(f"{where}: malformed data: URL", param=where)
    payload = url[match.end() :]
    if len(payload) > cap * 4 // 3 + 4:
        raise MediaError(f"{where}: media is over the {cap}-byte limit", param=where)
    if match.group(0).lower().endswith(";base64,"):
        return b64_bytes(payload, where, cap)
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(payload)


def b64_bytes(payload: str, where: str, cap: int = MAX_MEDIA_BYTES) -> bytes:
    """Decode base64 text (whitespace allowed), capped at ``cap`` bytes.

    Raises:
        MediaError: invalid base64 or over the cap.
    """
    if len(payload) > cap * 4 // 3 + 4:
        raise MediaError(f"{where}: media is over the {cap}-byte limit", param=where)
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{where}: invalid base64 media data", param=where) from None


def load_image_source(source: str, where: str, fetch: Any) -> Any:
    """A Pillow image from a part's source (see :func:`media_bytes`).

    Raises:
        MediaError: unreadable, refused (``media url rejected: ...``) or undecodable.
    """
    return decode_image(media_bytes(source, where, fetch), where)


def media_bytes(source: str, where: str, fetch: Any, cap: int = MAX_MEDIA_BYTES) -> bytes:
    """The bytes a part's source names: a ``data:`` URL, an http(s) URL
    (through ``fetch``, the policy's fetcher) or bare base64.

    Args:
        source (str): the URL or base64 text.
        where (str): the part named in errors.
        fetch (Callable[[str, str], bytes]): fetches an http(s) URL under the
            remote-media policy (:func:`.fetch.fetch_media` bound to a policy).
        cap (int): most bytes. Default: :data:`MAX_MEDIA_BYTES`.

    Returns:
        bytes: the media file.

    Raises:
        MediaError: an unknown scheme, bad base64, over the cap, or refused.
    """
    head = source[:8].lower()
    if head.startswith("data:"):
        return data_url_bytes(source, where, cap)
    if head.startswith(("http://", "https://")):
        return bytes(fetch(source, where))
    if "://" in source[:16] or source.startswith("file:"):
        scheme = source.split(":", 1)[0]
        raise MediaError(
            f"{where}: media url rejected: scheme {scheme!r} is not allowed (http, https "
            "or data: only)",
            param=where,
        )
    return b64_bytes(source, where, cap)
