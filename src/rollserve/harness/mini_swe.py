"""mini-swe-agent (PyPI ``mini-swe-agent`` 2.x) as a harness: its own ``DefaultAgent`` and
``LitellmModel``, unchanged, from one of its own configs (``options.config``, default
``swebench``); the model is the job's gateway and every command runs in the job's shell.

Options: ``config`` (a mini-swe-agent config name or file), ``step_limit`` (default the
config's), ``submit_output`` (submit what the agent printed after its completion marker,
instead of the task's default: the workspace's diff)."""

from __future__ import annotations

import os
import platform
import tempfile
from typing import Any

from pydantic import BaseModel

from rollserve.harness.base import HarnessJob

MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


# mini-swe-agent and litellm offline and without prompts, beside a global config directory of
# their own (MSWEA_GLOBAL_CONFIG_DIR).
OFFLINE_ENV = {
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_CONFIGURED": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
}


def _quiet_offline() -> None:
    """mini-swe-agent and litellm, offline and without prompts (before they are imported)."""
    for name, value in OFFLINE_ENV.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-"))


class EnvironmentConfig(BaseModel):
    """What mini-swe-agent reads of an environment's configuration."""

    cwd: str
    timeout: float


class RollserveEnvironment:
    """mini-swe-agent's environment protocol over the job's shell."""

    def __init__(self, job: HarnessJob, timeout: float) -> None:
        self.job = job
        self.config = EnvironmentConfig(cwd=job.workspace, timeout=timeout)

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = action.get("command", "")
        if cwd:
            command = f"cd {cwd} && {command}"
        done = self.job.run(command, timeout or self.config.timeout)
        output = {
            "output": done.output,
            "returncode": done.exit_code if done.exit_code is not None else -1,
            "exception_info": "the command timed out and was interrupted" if done.timed_out else "",
        }
        lines = done.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == MARKER and done.exit_code == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        environment = {"environment": self.config.model_dump(mode="json")}
        return {"info": {"config": {**environment, "environment_type": "rollserve"}}}


class MiniSweAgent:
    """Harness ``mini-swe-agent``."""

    name = "mini-swe-agent"

    def run(self, job: HarnessJob) -> None:
        _quiet_offline()
        import litellm
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.config import get_config_from_spec
        from minisweagent.models.litellm_model import LitellmModel

        litellm.suppress_debug_info = True
        config = get_config_from_spec(str(job.options.get("config", "swebench")))
        model_config = {
            k: v
            for k, v in config.get("model", {}).items()
            if k not in ("model_name", "model_class")
        }
        model_config["model_kwargs"] = {
            **model_config.get("model_kwargs", {}),
            "api_base": job.base_url,
            "api_key": job.api_key,
        }
        model = LitellmModel(
            model_name=f"openai/{job.model}", cost_tracking="ignore_errors", **model_config
        )
        timeout = float(config.get("environment", {}).get("timeout", 60))
        agent_config = {**config.get("agent", {}), "cost_limit": 0}
        if "step_limit" in job.options:
            agent_config["step_limit"] = int(job.options["step_limit"])
        agent = DefaultAgent(model, RollserveEnvironment(job, timeout), **agent_config)
        result = agent.run(job.prompt)
        print(f"mini-swe-agent: {result.get('exit_status')}", flush=True)
        if job.options.get("submit_output") and result.get("exit_status") == "Submitted":
            job.submit(str(result.get("submission", "")))
