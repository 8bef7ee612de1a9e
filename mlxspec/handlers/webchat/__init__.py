"""The web chat: its page routes and the ``/ws/chat`` protocol.

``pages`` answers the shell's routes (the document's ``web`` operations) and
``settings`` the always-allow list's (``/api/settings/tool-approvals``);
``socket`` is the WebSocket protocol (its ``set_*`` frames in ``settings_frames``,
its queue of prompts sent during a turn in ``queue``) and ``hub`` what its sockets share;
``agent`` runs one user turn as model steps with coding tool calls between them
(``tools/``: workspace confinement, the file tools, ``bash``, the approvals
file), ``turn`` runs one model step through the shared turn pipeline
(:mod:`mlxspec.handlers.turns`), ``sessions`` keeps the conversations in SQLite
and ``frames`` reads client frames against the document; ``search`` answers
``/api/sessions/search`` and ``/api/sessions/export``.
"""
