"""slime's custom generate function against a real ``rollserve serve`` and the tiny model.
slime is not on PyPI: ``Sample`` below is a contract fixture, slime's documented fields and
``Status`` names (``slime/utils/types.py``), and the checks are the length rules slime
enforces when it turns samples into training data."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rollserve.client.slime import fill_sample, make_generate
from rollserve.schema.jobs import JobErrorInfo, JobView
from tests.integration.conftest import Server, register_backend
from tests.servers import LlmServer


@dataclass
class Sample:
    """slime's Sample: the fields a generate function reads or fills."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)


# slime's default sampling parameters for a generate function (sglang_rollout.py).
SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 16,
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": False,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}


def test_slime_generate_fills_samples(
    server_factory: Callable[..., Server],
    tiny_model: Path,
    llm_server_factory: Callable[[Path, str], LlmServer],
) -> None:
    server = server_factory()
    server.start()
    llm = llm_server_factory(tiny_model, "tiny")
    register_backend(
        server,
        kind="sglang",
        url=llm.url,
        model="tiny",
        tokenizer=str(tiny_model),
        policy_version=5,
    )
    keyword = {"task_id": "kw", "kind": "keyword", "prompt": "Say abc.", "keywords": ["a"]}
    samples = [
        Sample(group_index=0, index=0, prompt="Say abc.", metadata={"rollserve_task": keyword}),
        Sample(group_index=0, index=1, prompt="Say abc.", metadata={"rollserve_task": keyword}),
        Sample(group_index=1, index=2, prompt=[{"role": "user", "content": "6*7?"}], label="42"),
    ]
    generate = make_generate(server.url, model="tiny", agent={"name": "tool", "max_turns": 2})

    async def run() -> list[Sample]:
        return list(await asyncio.gather(*(generate(None, s, dict(SAMPLING)) for s in samples)))

    done = asyncio.run(run())
    assert done == samples  # filled in place and returned
    feed = httpx.get(f"{server.url}/v1/results", params={"limit": 10}).json()["results"]
    jobs = {view["job_id"]: view for view in feed}
    for sample in samples:
        job = jobs[sample.metadata["rollserve_job_id"]]
        tokens = job["result"]["tokens"]
        # slime's rules: tokens = prompt + response; mask and logprobs cover the response.
        assert sample.tokens == tokens["prompt_ids"] + tokens["response_ids"]
        assert sample.response_length == len(tokens["response_ids"]) > 0
        assert (
            len(sample.loss_mask or [])
            == len(sample.rollout_log_probs or [])
            == len(tokens["response_ids"])
        )
        assert sample.reward == job["result"]["reward"]
        assert sample.weight_versions == ["5"] * len(tokens["turns"])
        assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        expected = "completed" if job["result"]["exit_reason"] == "submitted" else "truncated"
        assert sample.status.value == expected
    groups = {jobs[s.metadata["rollserve_job_id"]]["group_id"] for s in samples[:2]}
    assert len(groups) == 1  # one group_index, one group
    assert jobs[samples[2].metadata["rollserve_job_id"]]["result"]["evaluation"]["expected"] == "42"


def test_jobs_that_did_not_complete_are_aborted_or_failed() -> None:
    stale = Sample(index=0)
    fill_sample(
        stale, JobView(job_id="a", status="stale", error=JobErrorInfo(code="stale", message="old"))
    )
    assert stale.status is Sample.Status.ABORTED and stale.metadata["rollserve_error"] == "old"
    assert stale.tokens == [] and stale.reward is None  # nothing made up
    failed = Sample(index=1)
    fill_sample(failed, JobView(job_id="b", status="failed"))
    assert failed.status is Sample.Status.FAILED
