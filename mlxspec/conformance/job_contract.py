"""The job stream's grammar (``GET /api/jobs/{id}/stream``; reference, "Jobs").

A ``retry: <ms>`` frame alone first; then one ``data: <JobEvent>`` frame per event,
each valid against the document's ``JobEvent``, ``started`` first when there is
one; then ``event: end`` with ``data: {}``, the last frame. A stream of a job
that ended has its ``done`` or ``failed`` event just before ``end``, and nothing
follows a terminal event.
"""

from __future__ import annotations

import json

from mlxspec.conformance.schema_checks import fail, schema, validate
from mlxspec.conformance.stream_contract import _event_blocks

__all__ = ["check_job_stream"]

TERMINAL = ("done", "failed")


def check_job_stream(body: bytes, where: str = "stream") -> None:
    """Check a whole job stream (see the module docstring).

    Raises:
        ContractViolation: the first frame or ordering rule broken.
    """
    blocks = _event_blocks(body, where)
    if len(blocks) < 2 or len(blocks[0]) != 1 or not blocks[0][0].startswith("retry: "):
        raise fail(where, "a job stream opens with one 'retry: <ms>' frame")
    if not blocks[0][0][len("retry: ") :].isdigit():
        raise fail(where, f"retry is not a number of ms: {blocks[0][0]!r}")
    if blocks[-1] != ["event: end", "data: {}"]:
        raise fail(where, f"a job stream ends with 'event: end' and 'data: {{}}': {blocks[-1]}")
    kinds = []
    for i, block in enumerate(blocks[1:-1], 1):
        if len(block) != 1 or not block[0].startswith("data: "):
            raise fail(where, f"frame {i} is not one 'data: ' line: {block}")
        event = json.loads(block[0][len("data: ") :])
        validate(schema("JobEvent"), event, f"{where} frame {i}")
        kinds.append(event["type"])
    if "started" in kinds and kinds.index("started") != 0:
        raise fail(where, "'started' must be the first event")
    ends = [i for i, kind in enumerate(kinds) if kind in TERMINAL]
    if ends and ends[0] != len(kinds) - 1:
        raise fail(where, f"nothing may follow a terminal event: {kinds[ends[0] :]}")
    if not ends:
        raise fail(where, "a job stream that reaches 'end' has a terminal event before it")
