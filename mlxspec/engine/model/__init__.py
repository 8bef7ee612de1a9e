"""The model: loading (folders, the Hugging Face cache, GGUF), CPU weight
layout, memory fit and start-up warm-up."""
