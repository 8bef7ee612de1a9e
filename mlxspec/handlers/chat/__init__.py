"""``/v1/chat/completions`` and ``/v1/completions``: choices, logprobs."""
