"""Agents: drive an episode in a sandbox, registered by name."""
