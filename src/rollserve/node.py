"""The composition root: one node (``rollserve serve``) assembled from its settings and its
plug-in set, and the built-in plug-ins. Nothing else constructs a node's parts."""

from __future__ import annotations

from rollserve.agents.base import Agent
from rollserve.agents.command import CommandAgent
from rollserve.agents.external import ExternalAgent
from rollserve.agents.harness import HarnessAgent
from rollserve.agents.submit import SubmitAgent
from rollserve.agents.tool import ToolAgent
from rollserve.gateway.keys import Gateway
from rollserve.images.store import ImageStore, source_factories
from rollserve.llm.kinds import built_in_kinds, with_templates
from rollserve.llm.parsers import default_parsers
from rollserve.llm.router import Router
from rollserve.llm.session import Models
from rollserve.llm.templates import TemplateCache
from rollserve.pipeline.scheduler import Scheduler
from rollserve.pipeline.service import RolloutService
from rollserve.pipeline.stages import StageRunner
from rollserve.plugins import (
    ImageSourceFactory,
    LLMKind,
    Plugins,
    SandboxBackendFactory,
    StoreFactory,
)
from rollserve.registry import Registry, made
from rollserve.sandbox import SandboxManager
from rollserve.sandbox.manager import BUILT_IN as SANDBOX_BACKENDS
from rollserve.settings import Settings
from rollserve.storage.registry import default_stores, open_store
from rollserve.tasks.base import TaskHandler
from rollserve.tasks.code import CodeHandler
from rollserve.tasks.harbor import HarborHandler
from rollserve.tasks.lookup import LookupHandler
from rollserve.tasks.math import MathHandler
from rollserve.tasks.swe.handler import SweHandler
from rollserve.tasks.swebench.handler import SwebenchHandler


def default_plugins() -> Plugins:
    """The built-in plug-ins; plug-in modules add to them (``rollserve.plugins.add_plugins``)."""
    handlers: Registry[TaskHandler] = Registry("task kind")
    for handler in (
        MathHandler(),
        CodeHandler(),
        SweHandler(),
        SwebenchHandler(),
        LookupHandler(),
        HarborHandler(),
    ):
        handlers.register(handler.name, handler)
    parsers = default_parsers()
    agents: Registry[Agent] = Registry("agent")
    for agent in (
        SubmitAgent(),
        ToolAgent(parsers),
        ExternalAgent(parsers),
        HarnessAgent(parsers),
        CommandAgent(),
    ):
        agents.register(agent.name, agent)
    sandbox_backends: Registry[SandboxBackendFactory] = Registry("sandbox backend")
    for backend in SANDBOX_BACKENDS:
        sandbox_backends.register(backend.name, backend)
    image_sources: Registry[ImageSourceFactory] = source_factories()
    stores: Registry[StoreFactory] = default_stores()
    llm_kinds: Registry[LLMKind] = built_in_kinds()
    return Plugins(
        handlers=handlers,
        agents=agents,
        parsers=parsers,
        sandbox_backends=sandbox_backends,
        image_sources=image_sources,
        stores=stores,
        llm_kinds=llm_kinds,
    )


def build_node(settings: Settings, plugins: Plugins) -> RolloutService:
    """One node: its job store, image store and sandboxes, inference router, gateway and
    scheduler, made from ``settings`` with the plug-ins of ``plugins``."""
    store = open_store(settings, plugins.stores)
    images = ImageStore(settings, made(plugins.image_sources, settings))
    sandboxes = SandboxManager(settings, made(plugins.sandbox_backends, settings), images)
    templates = TemplateCache()
    router = Router(settings, store, with_templates(plugins.llm_kinds, templates))
    models = Models(router, templates, settings.llm_abort_resumes)
    gateway = Gateway()
    scheduler = Scheduler(
        settings,
        store,
        StageRunner(settings, sandboxes, plugins, models, gateway),
        paused=router.pause_report,
    )
    router.on_pause_change = scheduler.beat_now
    return RolloutService(
        settings,
        plugins,
        store=store,
        sandboxes=sandboxes,
        templates=templates,
        router=router,
        gateway=gateway,
        scheduler=scheduler,
    )
