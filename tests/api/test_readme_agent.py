"""The README's OpenAI-SDK agent runs as written against a live server (the tiny
model, so its answer means nothing: the loop and the wire are what is checked)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, LiveServer


def readme_agent() -> str:
    """The Python block under "An agent on the OpenAI SDK" in the README."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("An agent on the OpenAI SDK") :]
    found = re.search(r"```python\n(.*?)```", after, re.S)
    assert found is not None
    return found.group(1)


def test_the_readme_agent_runs(tiny_server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = readme_agent().replace("http://127.0.0.1:8080", tiny_server.base)
    code = code.replace(
        "messages=messages, tools=tools)", "messages=messages, tools=tools, max_tokens=8)"
    )
    assert tiny_server.base in code and "max_tokens=8" in code
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    assert capsys.readouterr().out  # it answered (or ran out of turns quietly)
