"""The plug-ins a pipeline starts with."""

from __future__ import annotations

from rollserve.agents.base import Agent
from rollserve.agents.submit import SubmitAgent
from rollserve.pipeline.stages import Plugins
from rollserve.registry import Registry
from rollserve.tasks.base import TaskHandler


def default_plugins() -> Plugins:
    """The built-in task handlers and agents; ``--plugins`` modules add to them."""
    handlers: Registry[TaskHandler] = Registry("task kind")
    agents: Registry[Agent] = Registry("agent")
    agents.register(SubmitAgent.name, SubmitAgent())
    return Plugins(handlers=handlers, agents=agents)
