"""A weight update in the middle of 32 running rollouts, once per pause mode, against
``rollserve llm serve`` with the tiny model: the trainer pauses the model through rollserve,
loads new weights into the inference server (SGLang's ``/update_weights_from_disk``) and
resumes with the new ``policy_version``. No rollout is lost, every generated token's logprob is
the one the weights of its recorded version give it (so the tokens are exact and tagged with
the right version), and each result's ``min/max_policy_version`` is that of its turns."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from rollserve.llm.local.tiny_model import tiny_model_dir
from tests.integration.conftest import Server, register_backend
from tests.servers import LlmServer

ROLLOUTS = 32
_AGENT = {"name": "tool", "max_turns": 4, "end_without_tool_call": False}


def _job(i: int) -> dict[str, Any]:
    return {
        "job_id": f"wu-{i}",
        "group_id": f"g{i // 8}",
        "task": {"task_id": f"kw-{i}", "kind": "keyword", "prompt": "Say abc.", "keywords": ["a"]},
        "model": "tiny",
        "agent": _AGENT,
        "sampling": {"max_tokens": 24},
    }


@pytest.fixture(scope="module")
def updated_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same architecture and tokenizer with other weights: the trainer's next policy."""
    return tiny_model_dir(tmp_path_factory.mktemp("policy-1"), seed=1)


@pytest.mark.parametrize(
    ("mode", "server_pause"),
    [("wait", None), ("abort", None), ("wait", "keep")],
    ids=["wait", "abort", "wait-and-server-keep"],
)
def test_weight_update_mid_rollout(
    mode: str,
    server_pause: str | None,
    server_factory: Callable[..., Server],
    tiny_model: Path,
    updated_model: Path,
    llm_server_factory: Callable[[Path, str], LlmServer],
) -> None:
    """``wait-and-server-keep``: the inference server is also paused the vLLM way
    (``/pause?mode=keep``: requests in flight stall) for longer than a model call may take."""
    settings = {"run_workers": "32", "init_workers": "8"}
    limits: dict[str, int] = {}
    if server_pause:
        settings["llm_request_timeout_s"] = "5"
        # The server generates one request at a time: with all 32 calls sent to it, the last
        # waits for 31 generations and can time out on a busy machine before any pause. A few
        # in flight keep each call's wait far below the timeout, and some stalled by the pause.
        limits["max_concurrency"] = 4
    server = server_factory(**settings)
    server.start()
    llm = llm_server_factory(tiny_model, "tiny")
    register_backend(
        server,
        kind="vllm",
        url=llm.url,
        model="tiny",
        tokenizer=str(tiny_model),
        policy_version=0,
        **limits,
    )
    with httpx.Client(base_url=server.url, timeout=120) as http:
        batch = http.post("/v1/jobs/batch", json={"jobs": [_job(i) for i in range(ROLLOUTS)]})
        assert batch.status_code == 202, batch.text

        # Once the rollouts are under way (turns served, most rollouts not finished) …
        _until(lambda: _served(http) >= ROLLOUTS + 8)
        if server_pause:
            frozen = httpx.post(f"{llm.root}/pause", params={"mode": server_pause})
            assert frozen.json() == {"status": "paused"}
            stalled = http.post("/v1/llm/models/tiny/pause", json={"mode": mode, "timeout_s": 0})
            assert stalled.json()["in_flight"] > 0  # calls stalled inside the server
            time.sleep(7)  # past llm_request_timeout_s: those calls time out
            backend = http.get("/v1/llm/backends").json()[0]
            assert backend["healthy"] and backend["failures"] == 0, str(backend)  # none ejected
            assert httpx.post(f"{llm.root}/resume").json() == {"status": "resumed"}
        paused = http.post("/v1/llm/models/tiny/pause", json={"mode": mode}).json()
        assert paused["paused"] and paused["mode"] == mode and paused["in_flight"] == 0, paused
        assert [b["paused"] for b in http.get("/v1/llm/backends").json()] == [True]
        served = _served(http)
        time.sleep(0.5)  # nothing is generated while paused, and nothing is ejected
        assert _served(http) == served
        assert http.get("/v1/llm/backends").json()[0]["healthy"]
        # … the trainer loads new weights into its inference server and resumes.
        loaded = httpx.post(
            f"{llm.root}/update_weights_from_disk",
            json={"model_path": str(updated_model), "weight_version": "1"},
            timeout=60,
        )
        assert loaded.status_code == 200, loaded.text
        resumed = http.post("/v1/llm/models/tiny/resume", json={"policy_version": 1}).json()
        assert not resumed["paused"] and resumed["policy_version"] == 1

        results = {}
        for i in range(ROLLOUTS):
            view = http.get(f"/v1/jobs/wu-{i}", params={"wait": 300}, timeout=310).json()
            assert view["status"] == "completed", view  # no rollout lost
            results[view["job_id"]] = view["result"]

    models = {v: _load(path) for v, path in ((0, tiny_model), (1, updated_model))}
    spans = {(r["min_policy_version"], r["max_policy_version"]) for r in results.values()}
    assert (0, 1) in spans, spans  # some rollouts have turns of both versions
    assert spans <= {(0, 0), (0, 1), (1, 1)}
    for job_id, result in results.items():
        versions = _check_exact(result["tokens"], models)
        assert result["min_policy_version"] == min(versions), job_id
        assert result["max_policy_version"] == max(versions), job_id


def _served(http: httpx.Client) -> int:
    return int(sum(b["served"] for b in http.get("/v1/llm/backends").json()))


def _until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def _load(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _check_exact(tokens: dict[str, Any], models: dict[int, Any]) -> list[int]:
    """Every turn's spans are where its tokens are; each generated token's logprob is what the
    weights of its segment's version give it after exactly the preceding tokens. Returns the
    versions of the turns."""
    sequence = tokens["prompt_ids"] + tokens["response_ids"]
    offset = len(tokens["prompt_ids"])
    mask, logprobs = tokens["response_mask"], tokens["response_logprobs"]
    assert len(mask) == len(logprobs) == len(tokens["response_ids"])
    assert tokens["logprob_mode"] == "raw"
    versions = []
    previous_end = offset
    for turn in tokens["turns"]:
        assert turn["prompt"] == {"start": 0, "end": turn["generation"]["start"]}
        start, end = turn["generation"]["start"], turn["generation"]["end"]
        assert start >= previous_end and end - start == turn["generated_tokens"]
        assert all(m == 0 for m in mask[previous_end - offset : start - offset])
        assert all(m == 1 for m in mask[start - offset : end - offset])
        at = start
        for segment in turn["segments"]:
            version = segment["policy_version"]
            versions.append(version)
            stop = at + segment["generated_tokens"]
            with torch.inference_mode():
                logits = models[version](torch.tensor([sequence[:stop]])).logits[0]
            expected = torch.log_softmax(logits.float(), dim=-1)
            for position in range(at, stop):
                want = float(expected[position - 1, sequence[position]])
                assert logprobs[position - offset] == pytest.approx(want, abs=1e-3)
            at = stop
        assert at == end
        assert turn["policy_version"] == turn["segments"][-1]["policy_version"]
        previous_end = end
    return versions
