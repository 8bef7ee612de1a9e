"""mlxspec's tests, in tiers by cost: ``unit/`` (pure, no model, no server),
``api/`` (tiny random-weight models from ``fixtures/``, in-process apps and live
uvicorn servers) and ``real/`` (the embedded SmolLM2-135M model).

A package, so test modules in different tiers may share a name and import the
shared modules as ``tests.helpers`` and ``tests.conftest``.
"""
