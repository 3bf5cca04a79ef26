"""``rollserve serve --plugins rollserve.testing.plugin``: the echo and keyword tasks and the
script agent."""

from __future__ import annotations

from rollserve.plugins import Plugins
from rollserve.testing.keyword import KeywordHandler
from rollserve.testing.pipeline import EchoHandler, ScriptAgent


def register(plugins: Plugins) -> None:
    plugins.handlers.register(EchoHandler.name, EchoHandler())
    plugins.handlers.register(KeywordHandler.name, KeywordHandler())
    plugins.agents.register(ScriptAgent.name, ScriptAgent())
