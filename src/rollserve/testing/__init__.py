"""Test doubles a user of rollserve would want too: small task handlers and agents that drive
the real pipeline through real sandboxes without a model."""
