"""The supervisor: ``--isolate`` runs each engine in a child process behind a
proxy, and ``--model-pool`` serves several models, one child each.

- :mod:`.child`: one :class:`~.child.Child` per worker process, with an explicit
  state (stopped, starting, ready, draining, dead, failed), restarted with back-off.
- :mod:`.routing`: model ids and the one pure function from a body's ``model``
  to the child that serves it.
- :mod:`.pool`: the resident set (LRU eviction, idle unload, ``keep_alive``, pins).
- :mod:`.proxy`: moves HTTP and WebSocket bytes to a child over its unix socket
  (httpx, websockets); it knows no API surface.
- :mod:`.parent`: the parent's ASGI app (``GET /engine``, the routing, the proxy).
- :mod:`.serve`: runs the parent; :mod:`.worker`: a child's entry point.

The engine and the handlers do not know they run in a child: a child is
``mlxspec serve MODEL --unix PATH`` with the parent's other settings.
"""
