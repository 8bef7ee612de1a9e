"""The web chat's coding tools, off unless the server starts with ``--web-tools``.

``workspace`` confines every path a call names to the workspace folder;
``files`` holds the file tools (``read``, ``ls``, ``grep``: read-only;
``edit``, ``write``), ``shell`` the ``bash`` tool (its own process group,
time and output capped); ``catalog`` the tools the model is offered and the
one entry point that runs a call; ``approvals`` the durable always-allow list
(reference, "Settings": ``/api/settings/tool-approvals``).
"""
