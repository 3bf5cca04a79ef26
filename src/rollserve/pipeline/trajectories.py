"""A job's trajectory turn by turn, for the viewer: from its result once it has one, from the
events its episode appended while it runs (or when it failed before a result)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollserve.schema.api import Trajectory
from rollserve.schema.jobs import TERMINAL, JobView
from rollserve.schema.trajectory import Message, TurnLog, split_turns
from rollserve.storage.browse import JobEvent


def build_trajectory(view: JobView, *, events: Sequence[JobEvent] = ()) -> Trajectory:
    """The trajectory of ``view``; ``events`` stand in for the turns of a job without a
    result (the latest attempt's)."""
    result = view.result
    trajectory = Trajectory(
        job_id=view.job_id,
        group_id=view.group_id,
        status=view.status,
        attempts=view.attempts,
        task_id=view.task_id,
        kind=view.kind,
        model=view.model,
        created=view.created,
        finished=view.finished,
        timing=view.timing,
        error=view.error,
    )
    if result is not None:
        trajectory.prelude, trajectory.turns = split_turns(result.messages, result.turn_log)
        trajectory.reward = result.reward
        trajectory.exit_reason = result.exit_reason.value
        trajectory.evaluation = result.evaluation
        trajectory.patch = result.patch
        trajectory.tool_errors = result.tool_errors
        trajectory.tokens = result.tokens
        trajectory.segments = result.segments
        trajectory.agent_run = result.agent_run
        return trajectory
    latest = max((e.attempt for e in events), default=None)
    messages: list[Message] = []
    logs: list[TurnLog] = []
    for event in events:
        if event.attempt != latest:
            continue
        messages += [Message.model_validate(m) for m in event.data.get("messages", [])]
        if event.data.get("log"):
            logs.append(TurnLog.model_validate(event.data["log"]))
    trajectory.prelude, trajectory.turns = split_turns(messages, logs)
    trajectory.live = latest is not None and view.status not in TERMINAL
    return trajectory


def add_token_text(trajectory: Trajectory, pieces: Callable[[list[int]], list[str]]) -> None:
    """Each token of ``trajectory``'s tokens, and of every segment, as text by ``pieces``
    (``tokens``, the last segment, decoded once)."""
    texts = [pieces(s.prompt_ids + s.response_ids) for s in trajectory.segments]
    if texts:
        trajectory.segment_text = texts
    tokens = trajectory.tokens
    if tokens is None:
        return
    if texts and trajectory.segments[-1] == tokens:
        trajectory.token_text = texts[-1]
    else:
        trajectory.token_text = pieces(tokens.prompt_ids + tokens.response_ids)
