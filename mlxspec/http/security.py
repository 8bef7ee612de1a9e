"""API-key authentication through Connexion's security middleware.

The OpenAPI document declares two schemes, ``bearerAuth`` (``Authorization:
Bearer <key>``, what the OpenAI SDKs send) and ``apiKeyAuth`` (``x-api-key:
<key>``, what the Anthropic SDK sends), required on every operation that does
not opt out with ``security: []`` (``/health``), plus the empty alternative
``{}`` that makes them optional. :func:`security_options` turns that into what
the server enforces: with a key, the ``{}`` alternative is removed from the
app's copy of the document (so ``/openapi.json`` states the requirement) and
Connexion calls :class:`ApiKeyCheck` for each scheme; without one, everything
passes. Connexion's own 401 (no credentials) and ours (a wrong key) become
``unauthorized`` errors in the surface's envelope through the app's error
handlers. A path no operation declares gets no security middleware from
Connexion; the app asks :func:`key_refusal` before answering it 404, so a keyed
server tells an unauthenticated client nothing about its routes.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from connexion.exceptions import OAuthProblem
from connexion.lifecycle import ConnexionRequest
from connexion.security import NO_VALUE

#: The message of a credential that does not match the key.
INVALID_KEY = "invalid API key"
#: The message of a request without a credential (Connexion's words, so every
#: 401 reads the same).
NO_KEY = "No authorization token provided"
#: The header of the ``apiKeyAuth`` scheme (the Anthropic SDK's).
API_KEY_HEADER = "x-api-key"


class ApiKeyCheck:
    """A Connexion security handler comparing a credential with the server's key.

    Connexion instantiates handlers with no arguments, so the app registers
    ``functools.partial(ApiKeyCheck, key)`` in ``security_map`` under ``bearer``
    (``type: http, scheme: bearer``) and ``apiKey``.

    Args:
        key (str | None): the configured key; ``None`` accepts every request.
    """

    def __init__(self, key: str | None) -> None:
        self._key = None if key is None else key.encode()

    def get_fn(
        self, security_scheme: dict[str, Any], required_scopes: Any
    ) -> Callable[[ConnexionRequest], Awaitable[Any]]:
        """The verification function Connexion runs for ``security_scheme``.

        The function returns token info on a match, Connexion's ``NO_VALUE`` when
        the scheme's header is absent (the next alternative is tried), and raises
        ``OAuthProblem`` (401) on a mismatch. Keys are compared with
        :func:`hmac.compare_digest`, in time independent of where they differ.
        """
        if security_scheme.get("type") == "http":
            read = _bearer_token
        else:
            read = functools.partial(_header, security_scheme["name"].lower())

        async def verify(request: ConnexionRequest) -> Any:
            if self._key is None:
                return {}
            credential = read(request)
            if credential is None:
                return NO_VALUE
            if not hmac.compare_digest(credential.encode(), self._key):
                raise OAuthProblem(detail=INVALID_KEY)
            return {"sub": "api-key"}

        return verify


def _header(name: str, request: ConnexionRequest) -> str | None:
    return request.headers.get(name) or None


def _bearer_token(request: ConnexionRequest) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (scheme case-insensitive,
    RFC 9110 section 11.1), or ``None`` for another or no scheme."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_refusal(request: ConnexionRequest, key: str | None) -> str | None:
    """Why ``request`` fails the API-key check, outside Connexion's security
    middleware (for paths no operation declares).

    Same rule as the declared alternatives: a bearer token or an
    ``x-api-key`` that matches passes, whichever is sent.

    Args:
        request (ConnexionRequest): the request.
        key (str | None): the configured key; ``None`` accepts every request.

    Returns:
        str | None: :data:`NO_KEY` or :data:`INVALID_KEY`, or ``None`` to pass.
    """
    if key is None:
        return None
    sent = [c for c in (_bearer_token(request), _header(API_KEY_HEADER, request)) if c]
    if any(hmac.compare_digest(c.encode(), key.encode()) for c in sent):
        return None
    return INVALID_KEY if sent else NO_KEY


def security_options(spec: dict[str, Any], key: str | None) -> dict[str, Any]:
    """Prepare ``spec`` (the app's own copy, edited in place) and return the
    ``security_map`` for ``connexion.AsyncApp.add_api``.

    Args:
        spec (dict): the OpenAPI document the app serves.
        key (str | None): the configured API key, or ``None`` for an open server.

    Returns:
        dict: ``{"bearer": ..., "apiKey": ...}`` handler factories.
    """
    if key is not None:
        spec["security"] = [req for req in spec.get("security", []) if req]
    factory = functools.partial(ApiKeyCheck, key)
    return {"bearer": factory, "apiKey": factory}
