"""The ``submit`` agent: no model; the job carries its submission, which is evaluated as is."""

from __future__ import annotations

from rollserve.agents.base import RunContext
from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, ExitReason
from rollserve.schema.run import RunOutput


class SubmitAgent:
    """``{"name": "submit", "submission": "..."}``: evaluates a given answer or patch."""

    name = "submit"

    def validate(self, config: AgentConfig) -> None:
        if not isinstance((config.model_extra or {}).get("submission"), str):
            raise InvalidInputError(
                "agent 'submit' needs a string field 'submission'", field="agent.submission"
            )

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput:
        self.validate(config)
        submission = str((config.model_extra or {})["submission"])
        context.submission = submission
        return RunOutput(exit_reason=ExitReason.SUBMITTED, submission=submission)
