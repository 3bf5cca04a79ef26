"""The web viewer's end-to-end set-up: Debian's Chromium driven by Playwright, a real
``rollserve serve`` with named tokens, the scripted model server (a test double replaying given
turns) in token mode, and real jobs in real sandboxes. Screenshots of every page go to
``test-artifacts/ui/`` for a reviewer to look at (in the rootless run, which may not write to
the checkout, to a directory of that user's under the temporary directory)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import ROOT, Server
from tests.missing import missing

ADMIN, VIEWER = "admin-token-for-ui-tests", "viewer-token-for-ui-tests"
SHOTS = (
    ROOT / "test-artifacts" / "ui"
    if os.access(ROOT, os.W_OK)
    else Path(tempfile.gettempdir()) / f"rollserve-ui-shots-{os.geteuid()}"
)
CHROMIUM = "/usr/bin/chromium"

MATH = {"kind": "math", "prompt": "What is 6*7?", "answer": "42"}
SOLVE = [
    {
        "content": "Let me compute it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7))"}}],
    },
    {"content": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]},
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium; missing Chromium skips here and fails in CI. One per module: while
    Playwright's synchronous API is open it holds an event loop in the thread, which the
    asynchronous tests that a worker runs next need free."""
    if shutil.which(CHROMIUM) is None:
        message = f"{CHROMIUM} is not installed (make setup installs Debian's chromium)"
        missing(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield launched
        launched.close()


class Viewer:
    """The running service the pages look at, and a way to act on it with the admin token."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.url = server.url
        self.admin = httpx.Client(
            base_url=server.url, timeout=90, headers={"Authorization": f"Bearer {ADMIN}"}
        )

    def api(self, path: str, **params: Any) -> Any:
        answer = self.admin.get(path, params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def submit(self, jobs: list[dict[str, Any]]) -> None:
        answer = self.admin.post("/v1/jobs/batch", json={"jobs": jobs})
        assert answer.status_code == 202, answer.text

    def wait(self, job_id: str) -> dict[str, Any]:
        view: dict[str, Any] = self.api(f"/v1/jobs/{job_id}", wait=60)
        assert view["status"] in ("completed", "failed"), view
        return view


def submit_job(job_id: str, answer: str, **extra: Any) -> dict[str, Any]:
    """A math job evaluated on a given answer: no model needed."""
    return {
        "job_id": job_id,
        "task": {"task_id": f"task-{job_id}", **MATH},
        "agent": {"name": "submit", "submission": answer},
        **extra,
    }


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Viewer]:
    """A server with jobs of every kind the pages show: a token-mode tool rollout ("solve"),
    a GRPO group of four ("g1", two right), echo jobs."""
    base = tmp_path_factory.mktemp("ui")
    tokens = [
        {"name": "admin", "token": ADMIN},
        {"name": "viewer", "token": VIEWER, "read_only": True},
    ]
    server = Server(base / "data", {"ROLLSERVE_API_TOKENS": json.dumps(tokens)})
    server.start()
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Registration probes a token-mode backend with one generation: the first turn answers it.
    with ScriptedLLMServer([{"content": "probe"}, *SOLVE], tokenizer=tiny_model) as llm:
        made = Viewer(server)
        spec = {
            "id": "tok",
            "kind": "vllm",
            "url": llm.url,
            "model": "scripted",
            "tokenizer": str(tiny_model),
            "policy_version": 3,
        }
        assert made.admin.post("/v1/llm/backends", json=spec).status_code == 201
        solve = {"job_id": "solve", "task": {"task_id": "six", **MATH}, "model": "scripted"}
        group = [submit_job(f"g1-{i}", "42" if i < 2 else "41", group_id="g1") for i in range(4)]
        echo = [
            {
                "job_id": f"echo-{i}",
                "task": {"task_id": f"e{i}", "kind": "echo", "prompt": "hi"},
                "agent": {"name": "submit", "submission": "hi" if i else "no"},
            }
            for i in range(3)
        ]
        made.submit([solve, *group, *echo])
        for job in [solve, *group, *echo]:
            made.wait(str(job["job_id"]))
        try:
            yield made
        finally:
            made.admin.close()
            server.stop()


def open_page(browser: Any) -> tuple[Any, list[str]]:
    """A fresh page, and the errors its scripts report (none is expected)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return page, errors


def sign_in(browser: Any, viewer: Viewer, token: str = VIEWER) -> tuple[Any, list[str]]:
    """A page signed in with ``token`` through the sign-in form, and its script errors."""
    page, errors = open_page(browser)
    page.goto(f"{viewer.url}/ui/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{viewer.url}/ui/")
    return page, errors


def shot(page: Any, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
