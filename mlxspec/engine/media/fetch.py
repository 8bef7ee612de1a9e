"""Remote media under a destination policy: a media URL is attacker-controlled.

The reference's rule (chat request body, "Remote (http/https) media URLs"):
http(s) only; private, loopback, link-local, multicast and other non-global
destinations refused unless the operator opts in (``--allow-private-media`` /
``MLXSPEC_ALLOW_PRIVATE_MEDIA=1``); every redirect hop checked again; a 10 s
timeout and a 64 MB body cap (256 MB for video). :func:`check_address` is the
one decision, allow or refuse-with-reason, for each resolved address. The
connection goes to the address that was checked (the URL's host stays in the
``Host`` header and TLS name), so a DNS answer that changes between the check
and the connect (rebinding) cannot move it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from mlxspec.engine.media.images import MAX_MEDIA_BYTES, MediaError

__all__ = ["FetchPolicy", "MediaUrlRejected", "check_address", "fetch_media"]

#: Most redirects followed (each hop checked).
MAX_REDIRECTS = 5


class MediaUrlRejected(MediaError):
    """A remote media URL the policy refused or could not fetch (400
    ``media url rejected: <why>``)."""


@dataclass(frozen=True)
class FetchPolicy:
    """How remote media is fetched.

    Args:
        allow_private (bool): reach private/loopback/link-local destinations
            (``--allow-private-media``). Default: ``False``.
        connect_timeout (float): seconds to connect. Default: ``10.0``.
        read_timeout (float): seconds between bytes, and for the whole body.
            Default: ``10.0``.
        max_bytes (int): body cap. Default: :data:`~.images.MAX_MEDIA_BYTES`.
    """

    allow_private: bool = False
    connect_timeout: float = 10.0
    read_timeout: float = 10.0
    max_bytes: int = MAX_MEDIA_BYTES


def check_address(address: str, allow_private: bool) -> str | None:
    """Why ``address`` may not be fetched from, or ``None`` when it may.

    Args:
        address (str): an IPv4 or IPv6 address (a resolved one).
        allow_private (bool): the operator opted in to loopback, link-local
            and private destinations (multicast, unspecified and reserved stay
            refused).

    Returns:
        str | None: the reason, e.g. ``"127.0.0.1 is a loopback address"``.
    """
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast:
        return f"{ip} is a multicast address"
    if ip.is_unspecified:
        return f"{ip} is not a routable address"
    for kind, hit in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("private", ip.is_private),
    ):
        if hit:
            if allow_private:
                return None
            hint = "start the server with --allow-private-media to allow it"
            return f"{ip} is a {kind} address ({hint})"
    if ip.is_reserved or not ip.is_global:
        return f"{ip} is not a routable address"
    return None


def _resolve(host: str, port: int, where: str) -> str:
    """The first address of ``host`` (IP literals as they are)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise MediaUrlRejected(
            f"{where}: media url rejected: cannot resolve {host} ({e})", where
        ) from None
    return str(infos[0][4][0])


def _reject(where: str, why: str) -> MediaUrlRejected:
    return MediaUrlRejected(f"{where}: media url rejected: {why}", param=where)


def fetch_media(url: str, where: str, policy: FetchPolicy) -> bytes:
    """GET ``url`` under ``policy``, following redirects hop by hop.

    Args:
        url (str): an http(s) URL.
        where (str): the part named in errors.
        policy (FetchPolicy): destinations, timeouts and cap.

    Returns:
        bytes: the body.

    Raises:
        MediaUrlRejected: scheme, destination, status, timeout or size refused.
    """
    import httpx

    timeout = httpx.Timeout(policy.read_timeout, connect=policy.connect_timeout)
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise _reject(where, f"only http and https URLs are fetched, not {url[:60]!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            address = _resolve(parts.hostname, port, where)
            if (why := check_address(address, policy.allow_private)) is not None:
                raise _reject(where, why)
            target = _pinned(url, parts.hostname, address)
            extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
            try:
                with client.stream(
                    "GET", target, headers={"Host": parts.netloc}, extensions=extensions
                ) as response:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise _reject(where, f"the server answered {response.status_code}")
                    return _read_capped(response, policy, where)
            except httpx.TimeoutException:
                raise _reject(where, "the fetch timed out") from None
            except httpx.HTTPError as e:
                raise _reject(where, f"the fetch failed ({type(e).__name__})") from None
    raise _reject(where, f"more than {MAX_REDIRECTS} redirects")


def _pinned(url: str, host: str, address: str) -> str:
    """``url`` with its host replaced by the checked ``address``."""
    parts = urlsplit(url)
    literal = f"[{address}]" if ":" in address else address
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def _read_capped(response: object, policy: FetchPolicy, where: str) -> bytes:
    """The body, refused once it passes the cap (a declared length first)."""
    import time

    declared = response.headers.get("content-length")  # type: ignore[attr-defined]
    if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
        raise _reject(where, f"the body is over the {policy.max_bytes}-byte limit")
    deadline = time.monotonic() + policy.read_timeout
    chunks, size = [], 0
    for chunk in response.iter_bytes():  # type: ignore[attr-defined]
        size += len(chunk)
        if size > policy.max_bytes:
            raise _reject(where, f"the body is over the {policy.max_bytes}-byte limit")
        if time.monotonic() > deadline:
            raise _reject(where, "the fetch timed out")
        chunks.append(chunk)
    return b"".join(chunks)
