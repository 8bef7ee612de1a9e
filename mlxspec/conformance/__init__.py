"""Conformance tooling: schemathesis runs, parity against mlx_lm.server and
response-contract checks against the OpenAPI document."""
