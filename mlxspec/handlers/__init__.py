"""HTTP handlers: Connexion operationId targets, one module per API surface.

Each module translates wire <-> engine types and owns no model state; the
engine comes from the application state set up in :mod:`mlxspec.http.app`.
"""
