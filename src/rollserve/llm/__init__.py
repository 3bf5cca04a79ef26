"""Inference backends (vLLM, SGLang, OpenAI-compatible), the load-aware router, chat-template
token accounting, and rollserve's own CPU inference server."""
