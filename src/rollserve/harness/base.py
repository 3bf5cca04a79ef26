"""The harness Protocol and what a harness gets: its job's task, an OpenAI-compatible base URL
for its model (the job's gateway), and the job's sandbox (commands in its persistent PTY
shell, files)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

# Commands wait this long over their own timeout for the gateway's answer.
_SLACK_S = 30.0


@dataclass(frozen=True)
class CommandOutput:
    """A command's result in the job's shell."""

    output: str  # stdout and stderr interleaved
    exit_code: int | None  # None: interrupted (its timeout, or it waited for input)
    timed_out: bool = False
    truncated: bool = False


class HarnessError(Exception):
    """The gateway refused a harness's request (its message says why)."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status, self.code = status, error.get("code")
        super().__init__(f"{status} {error.get('message', body)}")


class HarnessJob:
    """One job as its harness sees it. ``base_url`` and ``api_key`` are what an OpenAI SDK
    (or litellm) takes; ``options`` are the job's ``agent.options``."""

    def __init__(
        self, socket: str, key: str, base_url: str, options: dict[str, Any] | None = None
    ) -> None:
        self.key = key
        self.base_url = base_url
        self.api_key = key
        self.options = dict(options or {})
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=socket),
            base_url=f"http://gateway/v1/gateway/{key}",
            timeout=httpx.Timeout(60.0, read=None),
        )
        found = self._call("GET", "/task").json()
        self.task: dict[str, Any] = found["task"]
        self.model: str = found["model"]
        self.workspace: str = found["workspace"]

    @property
    def prompt(self) -> str:
        return str(self.task.get("prompt", ""))

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = self._http.request(method, path, **kwargs)
        if answer.status_code >= 400:
            try:
                body = answer.json()
            except json.JSONDecodeError:
                body = answer.text
            raise HarnessError(answer.status_code, body)
        return answer

    def run(self, command: str, timeout: float | None = None) -> CommandOutput:
        """Run ``command`` in the job's shell (cwd and environment carry over)."""
        body = {"command": command, "timeout": timeout}
        wait = httpx.Timeout(60.0, read=(timeout or 3600.0) + _SLACK_S)
        found = self._call("POST", "/sandbox/shell", json=body, timeout=wait).json()
        return CommandOutput(
            output=found["output"],
            exit_code=found["exit_code"],
            timed_out=found["timed_out"],
            truncated=found["truncated"],
        )

    def read_file(self, path: str) -> bytes:
        return self._call("GET", "/sandbox/file", params={"path": path}).content

    def write_file(self, path: str, data: bytes) -> None:
        self._call("PUT", "/sandbox/file", params={"path": path}, content=data)

    def submit(self, answer: str | None = None) -> None:
        """What the job's evaluation takes (None: the task's default, e.g. the workspace's
        diff)."""
        self._call("POST", "/submit", json={"answer": answer})

    def close(self) -> None:
        self._http.close()


class Harness(Protocol):
    """An agent that runs beside the sandbox, registered by its ``name`` (entry points of the
    ``rollserve.harnesses`` group, or ``module:attribute``)."""

    name: str

    def run(self, job: HarnessJob) -> None:
        """Play the episode; return when done (an exception is the agent's crash)."""
        ...
