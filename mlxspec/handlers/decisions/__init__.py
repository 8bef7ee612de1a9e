"""Decision scoring: ``/v1/decisions`` and ``/v1/systemone``."""
