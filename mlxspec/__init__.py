"""mlxspec: a spec-driven, conformance-first OpenAI-compatible LLM server on MLX."""

__version__ = "0.1.0"
