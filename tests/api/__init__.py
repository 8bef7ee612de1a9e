"""Tests on tiny random-weight models built by ``fixtures/``: the engine, the
in-process app and live uvicorn servers (fixtures in this folder's ``conftest.py``)."""
