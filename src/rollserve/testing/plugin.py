"""``rollserve serve --plugins rollserve.testing.plugin``: the echo task and script agent."""

from __future__ import annotations

from rollserve.pipeline.stages import Plugins
from rollserve.testing.pipeline import EchoHandler, ScriptAgent


def register(plugins: Plugins) -> None:
    plugins.handlers.register(EchoHandler.name, EchoHandler())
    plugins.agents.register(ScriptAgent.name, ScriptAgent())
