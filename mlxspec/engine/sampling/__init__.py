"""Choosing the next token: mlx-lm's samplers and logits processors as
configured per request, and the grammar mask of structured output."""
