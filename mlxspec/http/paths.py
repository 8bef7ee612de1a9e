"""The document's paths as a router sees them: the methods of a resource, the
concrete paths a template also matches, and the route a mistyped base URL meant.

Starlette tries Connexion's routes in order, one per operation, so by itself it
lists the wrong ``Allow`` methods on a 405 and lets a templated path take a
request for a concrete one; these helpers answer from the OpenAPI document.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "METHOD_ORDER",
    "allowed_methods",
    "post_takes_body",
    "literal_methods",
    "shadowed_methods",
    "suggest_path",
]

#: The order methods are listed in an ``Allow`` header.
METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(spec: dict[str, Any]) -> Callable[[str], str | None]:
    """A function from a request path to the ``Allow`` header of its resource:
    every method the document declares on the path templates that match it,
    ``HEAD`` with ``GET`` (Starlette answers it), in :data:`METHOD_ORDER`.

    Starlette builds a 405's ``Allow`` from the first route whose path matched,
    and Connexion adds one route per operation, so ``PUT /v1/responses/{id}``
    listed ``HEAD, GET`` and left out ``DELETE``; RFC 9110 section 15.5.6 asks for
    the methods the resource supports.

    Args:
        spec (dict): the served OpenAPI document.

    Returns:
        Callable[[str], str | None]: the header value, ``None`` for no match.
    """
    routes, literal = _path_patterns(spec), literal_methods(spec)

    def allow(path: str) -> str | None:
        found = literal.get(path) or set().union(*(m for _, rx, m in routes if rx.match(path)))
        return ", ".join(m for m in METHOD_ORDER if m in found) or None

    return allow


def _path_patterns(spec: dict[str, Any]) -> list[tuple[str, re.Pattern[str], set[str]]]:
    """Each document path, as a regular expression (a template matches one
    segment), with its methods."""
    routes = []
    for template, item in spec.get("paths", {}).items():
        pattern = re.escape(template)
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", pattern)
        routes.append((template, re.compile(pattern + r"\Z"), _methods(item)))
    return routes


def shadowed_methods(spec: dict[str, Any]) -> dict[str, set[str]]:
    """:func:`literal_methods` of the concrete paths a templated path also matches."""
    templated = [rx for path, rx, _ in _path_patterns(spec) if "{" in path]
    return {
        path: methods
        for path, methods in literal_methods(spec).items()
        if any(rx.match(path) for rx in templated)
    }


def literal_methods(spec: dict[str, Any]) -> dict[str, set[str]]:
    """The methods of each document path without a template (``/v1/responses/input_tokens``).

    OpenAPI 3.1 ("Path Templating Matching"): a concrete path wins over a
    templated one that also matches, so ``GET /v1/responses/input_tokens`` is a
    405 on the concrete path, not a lookup of response ``input_tokens``
    (Starlette would try the next route, ``/v1/responses/{response_id}``).
    """
    paths = spec.get("paths", {})
    return {path: _methods(item) for path, item in paths.items() if "{" not in path}


def _methods(item: dict[str, Any]) -> set[str]:
    """A path item's methods, ``HEAD`` with ``GET`` (Starlette answers it)."""
    methods = {m.upper() for m in item if m.upper() in METHOD_ORDER}
    return methods | {"HEAD"} if "GET" in methods else methods


def post_takes_body(spec: dict[str, Any]) -> Callable[[str], bool | None]:
    """A function telling whether a ``POST`` to a path reaches an operation that
    declares a ``requestBody`` (``True``), one that declares none
    (``/admin/cache/flush``, ``.../cancel``: ``False``), or no operation (``None``).

    Connexion reads no body on the second kind, so it refuses no ``Content-Type``
    there either; the app does. A concrete path wins over a template.

    Args:
        spec (dict): the served OpenAPI document.

    Returns:
        Callable[[str], bool | None]: the answer for a request path.
    """
    paths = spec.get("paths", {})
    posts = [
        (t, rx, "requestBody" in paths[t]["post"])
        for t, rx, methods in _path_patterns(spec)
        if "POST" in methods
    ]
    literal = {t: body for t, _, body in posts if "{" not in t}
    templated = [(rx, body) for t, rx, body in posts if "{" in t]

    def takes_body(path: str) -> bool | None:
        if path in literal:
            return literal[path]
        return next((body for rx, body in templated if rx.match(path)), None)

    return takes_body


def post_body_types(spec: dict[str, Any]) -> Callable[[str], tuple[str, ...]]:
    """A function from a request path to the media types its ``POST``
    operation's ``requestBody`` declares, in the document's order
    (``("application/json",)`` where it declares none or there is no operation),
    for the 415 messages to name what the route takes. A concrete path wins.

    Args:
        spec (dict): the served OpenAPI document.

    Returns:
        Callable[[str], tuple[str, ...]]: the types for a request path.
    """
    paths = spec.get("paths", {})
    posts = [
        (t, rx, tuple(paths[t]["post"].get("requestBody", {}).get("content", {})))
        for t, rx, methods in _path_patterns(spec)
        if "POST" in methods
    ]
    literal = {t: types for t, _, types in posts if "{" not in t}
    templated = [(rx, types) for t, rx, types in posts if "{" in t]

    def body_types(path: str) -> tuple[str, ...]:
        found = literal.get(path)
        if found is None:
            found = next((types for rx, types in templated if rx.match(path)), ())
        return found or ("application/json",)

    return body_types


def suggest_path(spec: dict[str, Any]) -> Callable[[str, str], str | None]:
    """A function from an unknown request path (and its method) to the document
    path its client probably meant, or ``None``.

    The usual slip is the client's base URL: the ``openai`` SDK wants it to end
    in ``/v1`` and the ``anthropic`` SDK wants it without, so a request arrives
    as ``/chat/completions`` or ``/v1/v1/messages``. The guess adds or removes
    one leading ``/v1`` (or, for a path ending in ``/``, drops the slashes: the
    server does not redirect them) and keeps it when a document path takes that
    method there (``HEAD`` with ``GET``).

    Args:
        spec (dict): the served OpenAPI document.

    Returns:
        Callable[[str, str], str | None]: ``(path, method)`` -> the path to suggest.
    """
    routes = _path_patterns(spec)

    def suggest(path: str, method: str) -> str | None:
        if path.endswith("/") and path != "/":
            guess = path.rstrip("/")
        elif path.startswith("/v1/v1/"):
            guess = path[3:]
        elif path != "/v1" and not path.startswith("/v1/"):
            guess = "/v1" + path
        else:
            return None
        fits = any(rx.match(guess) and method.upper() in m for _, rx, m in routes)
        return guess if fits else None

    return suggest
