"""Test doubles a user of rollserve would want too: a scripted LLM server, fake inference
backends, small task handlers and agents that drive the real pipeline through real sandboxes
without a model, and a plug-in that serves them. rollserve's own fixtures (a throwaway
PostgreSQL, image builders, test users) are in ``rollserve.fixtures``."""
