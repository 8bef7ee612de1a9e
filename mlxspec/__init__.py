"""mlxspec: a spec-driven, conformance-first OpenAI-compatible LLM server on MLX."""

from mlxspec.host import blas as _blas

# Before anything imports mlx.core: MLX's CPU backend then multiplies with an
# optimised BLAS instead of the reference one its Linux wheel links (see blas.py).
_blas.install()

__version__ = "0.1.0"
