"""rollserve: Rollout-as-a-Service for reinforcement-learning training of multi-turn LLM agents."""

__version__ = "0.1.0"
