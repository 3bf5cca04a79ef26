"""The plug-ins a pipeline starts with."""

from __future__ import annotations

from rollserve.agents.base import Agent
from rollserve.agents.command import CommandAgent
from rollserve.agents.external import ExternalAgent
from rollserve.agents.harness import HarnessAgent
from rollserve.agents.submit import SubmitAgent
from rollserve.agents.tool import ToolAgent
from rollserve.llm.parsers import default_parsers
from rollserve.pipeline.stages import Plugins
from rollserve.registry import Registry
from rollserve.tasks.base import TaskHandler
from rollserve.tasks.code import CodeHandler
from rollserve.tasks.harbor import HarborHandler
from rollserve.tasks.lookup import LookupHandler
from rollserve.tasks.math import MathHandler
from rollserve.tasks.swe.handler import SweHandler
from rollserve.tasks.swebench.handler import SwebenchHandler


def default_plugins() -> Plugins:
    """The built-in task handlers, agents and parsers; ``--plugins`` modules add to them."""
    handlers: Registry[TaskHandler] = Registry("task kind")
    handlers.register(MathHandler.name, MathHandler())
    handlers.register(CodeHandler.name, CodeHandler())
    handlers.register(SweHandler.name, SweHandler())
    handlers.register(SwebenchHandler.name, SwebenchHandler())
    handlers.register(LookupHandler.name, LookupHandler())
    handlers.register(HarborHandler.name, HarborHandler())
    parsers = default_parsers()
    agents: Registry[Agent] = Registry("agent")
    agents.register(SubmitAgent.name, SubmitAgent())
    agents.register(ToolAgent.name, ToolAgent(parsers))
    agents.register(ExternalAgent.name, ExternalAgent(parsers))
    agents.register(HarnessAgent.name, HarnessAgent(parsers))
    agents.register(CommandAgent.name, CommandAgent())
    return Plugins(handlers=handlers, agents=agents, parsers=parsers)
