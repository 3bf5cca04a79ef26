"""rollserve's own CPU inference server (``rollserve llm serve``): a transformers engine behind
vLLM's and SGLang's HTTP APIs, and the tiny model it serves in tests and demos."""
