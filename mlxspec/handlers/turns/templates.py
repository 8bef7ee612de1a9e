"""Prompt building for chat bodies, and the guard around a request's own template.

The document refuses ``chat_template_kwargs.chat_template`` unless the operator
started the server with ``--allow-request-templates`` (the served document's
``x-mlxspec-request-templates-off`` overlay). A body that brings one on such a
server renders it in the engine's sandbox (:mod:`mlxspec.engine.template_sandbox`)
within the configured budget, and :func:`build_prompt` makes that render:

* run on the template threads, apart from every other prompt build;
* hold a place in the engine's admission queue while it runs (so a flood of
  them is refused with 429 ``queue_full`` like any other work), until the
  render itself has ended;
* stop at its next step when the client disconnects (499 ``cancelled``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from connexion.context import scope

from mlxspec.engine import (
    EngineProtocol,
    TemplateBudget,
    off_loop,
    template_off_loop,
)
from mlxspec.handlers.events import until_disconnect

T = TypeVar("T")


def template_budget(engine: EngineProtocol, body: Mapping[str, Any]) -> TemplateBudget | None:
    """The budget of the chat template ``body`` brings, or ``None`` when the
    prompt renders with the model's own (the operator's, unbounded).

    Args:
        engine (EngineProtocol): the serving engine (it knows the model's own
            templates' names).
        body (Mapping): an OpenAI-shaped chat body, validated.

    Returns:
        TemplateBudget | None: the server's ``--request-template-steps`` and
        ``--request-template-seconds``, with a stop flag of its own.
    """
    if engine.request_template(body.get("chat_template_kwargs")) is None:
        return None
    config = scope["state"].get("config")
    defaults = TemplateBudget()
    return TemplateBudget(
        steps=getattr(config, "request_template_steps", defaults.steps),
        seconds=getattr(config, "request_template_seconds", defaults.seconds),
    )


async def build_prompt(
    engine: EngineProtocol, budget: TemplateBudget | None, fn: Callable[..., T], *args: Any
) -> T:
    """Run ``fn(*args)`` (a prompt build) off the event loop; with a ``budget``
    (the body brings its own template), guarded as the module docstring says.

    Args:
        engine (EngineProtocol): the serving engine (its admission counts the render).
        budget (TemplateBudget | None): from :func:`template_budget`.
        fn (Callable[..., T]): the build, rendering with ``budget``.
        *args: its arguments.

    Returns:
        T: what ``fn`` returned.

    Raises:
        QueueFullError: the admission queue is full (429).
        ApiError: ``cancelled`` (499) when the client left first.
        Exception: whatever ``fn`` raised (``TemplateBoundError``, a 400).
    """
    if budget is None:
        return await off_loop(fn, *args)
    with engine.hold("chat template"):
        render = asyncio.ensure_future(template_off_loop(fn, *args))
        try:
            return await until_disconnect(asyncio.shield(render))
        finally:
            if not render.done():  # the client left: stop at the next step
                budget.stop.set()
            # the render's thread keeps its place in the queue until it returns
            await asyncio.wait({render})
            if not render.cancelled():
                render.exception()  # retrieved: raised above, or the client is gone
