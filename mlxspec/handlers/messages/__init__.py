"""``/v1/messages`` (Anthropic Messages) and its token count."""
