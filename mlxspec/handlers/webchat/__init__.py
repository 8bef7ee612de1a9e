"""The web chat: its page routes and the ``/ws/chat`` protocol.

``pages`` answers the shell's routes (the document's ``web`` operations);
``socket`` is the WebSocket protocol, ``turn`` runs one turn through the shared
turn pipeline (:mod:`mlxspec.handlers.turns`), ``sessions`` keeps the
conversations in SQLite and ``frames`` reads client frames against the document.
"""
