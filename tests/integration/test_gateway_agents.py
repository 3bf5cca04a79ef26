"""Agents rollserve did not write, run unchanged through the gateway: an agent on the official
``openai`` SDK (function calling, and the same with ``stream=True``) inside a bwrap sandbox
whose network is off, against the scripted model server in token mode, through a real
``rollserve serve``. Every turn is checked token by token against what the backend saw and
returned, and a history the agent rewrote makes a second segment."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings
from rollserve.testing.scripted import ScriptedLLMServer, ScriptedTurn
from tests.conformance.conftest import require
from tests.integration.agents_env import IN_SANDBOX, PROGRAMS, agents_dir
from tests.integration.conftest import Server, register_backend

PROBE = {"content": "ok"}  # the turn registration's probe takes
PYTHON = f"{IN_SANDBOX}/venv/bin/python"
# No mount: the host's own python3 runs it, the program given on its command line.
STDLIB_AGENT = {"command": ["python3", "-c", (PROGRAMS / "stdlib_agent.py").read_text()]}
AGENT = f"{IN_SANDBOX}/programs/openai_tool_agent.py"
TURNS = [
    {
        "content": "Let me compute it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7))"}}],
    },
    {
        "content": "Checking once more.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "expr 6 \\* 7"}}],
    },
    {"content": "The answer is \\boxed{42}."},
]


@pytest.fixture(scope="session")
def agents() -> Path:
    return agents_dir()


@pytest.fixture
def running(
    server_factory: Callable[..., Server], tiny_model: Path
) -> Iterator[Callable[[list[dict[str, Any]]], tuple[Server, ScriptedLLMServer]]]:
    made: list[ScriptedLLMServer] = []

    def start(turns: list[dict[str, Any]], **env: str) -> tuple[Server, ScriptedLLMServer]:
        server = server_factory(run_timeout_s="60", **env)
        server.start()
        llm = ScriptedLLMServer([PROBE, *turns], model="policy", tokenizer=tiny_model).start()
        made.append(llm)
        register_backend(
            server, kind="vllm", url=llm.url, model="policy", tokenizer=str(tiny_model)
        )
        return server, llm

    yield start
    for llm in made:
        llm.stop()


def _job(
    server: Server, agent: dict[str, Any], agents: Path | None, **extra: Any
) -> dict[str, Any]:
    """The result of a job of ``agent`` (``agents`` bound read-only for its code, if given)."""
    mount = {"mount": str(agents)} if agents is not None else {}
    request = {
        "task": {
            "task_id": "six-times-seven",
            "kind": "math",
            "prompt": "What is 6*7?",
            "answer": "42",
        },
        "model": "policy",
        "agent": {"name": "external", **mount, **agent},
        **extra,
    }
    answer = httpx.post(f"{server.url}/v1/jobs", json=request, timeout=30)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["job_id"]
    view = httpx.get(f"{server.url}/v1/jobs/{job_id}", params={"wait": 120}, timeout=130).json()
    assert view["status"] == "completed", view
    result: dict[str, Any] = view["result"]
    return result


def _check_tokens(
    result: dict[str, Any],
    llm: ScriptedLLMServer,
    tokenizer: Any,
    turns: list[dict[str, Any]] = TURNS,
) -> None:
    """Each segment exactly what the backend saw and generated: every turn's prompt is what
    the backend received, and (after a segment's first) the previous turn's prompt and
    generation plus a suffix; the generated ids and logprobs are what it returned; the mask is
    1 on exactly the generated tokens."""
    segments = result["segments"] or [result["tokens"]]
    sent = [body for path, body in llm.requests if path.endswith("/completions")][1:]
    served = [ScriptedTurn.model_validate(t) for t in turns]
    call = 0
    for index, segment in enumerate(segments):
        assert segment["segment"] == index
        ids = segment["prompt_ids"] + segment["response_ids"]
        mask = [0] * len(segment["prompt_ids"]) + segment["response_mask"]
        logprobs = [0.0] * len(segment["prompt_ids"]) + segment["response_logprobs"]
        generated: set[int] = set()
        previous_end = None
        for turn in segment["turns"]:
            start, end = turn["prompt"]["start"], turn["prompt"]["end"]
            assert start == 0 and sent[call]["prompt"] == ids[:end]
            if previous_end is not None:
                assert end > previous_end  # the previous turn's ids, then the suffix
            text = llm.turn_text(served[call])
            expected = tokenizer.encode(text, add_special_tokens=False)
            expected.append(tokenizer.eos_token_id)
            g0, g1 = turn["generation"]["start"], turn["generation"]["end"]
            assert g0 == end and ids[g0:g1] == expected
            assert logprobs[g0:g1] == [llm.logprob] * len(expected)
            generated.update(range(g0, g1))
            previous_end = g1
            call += 1
        assert {i for i, m in enumerate(mask) if m == 1} == generated
        assert all(logprobs[i] == 0.0 for i in range(len(ids)) if i not in generated)
    assert call == len(sent)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_sdk_agent_in_the_sandbox(
    agents: Path,
    running: Callable[..., tuple[Server, ScriptedLLMServer]],
    tiny_model: Path,
    stream: bool,
) -> None:
    from transformers import AutoTokenizer

    server, llm = running(TURNS)
    command = [PYTHON, AGENT, "--summarize", "1", *(["--stream"] if stream else [])]
    result = _job(server, {"command": command}, agents)

    assert result["reward"] == 1.0 and result["exit_reason"] == "submitted"
    run = result["agent_run"]
    assert run["exit_code"] == 0 and run["model_calls"] == 3 and run["refused_calls"] == 0
    assert "final: The answer is \\boxed{42}." in run["stdout_tail"]
    # The summary rewrote the history after the first tool result: two segments.
    assert len(result["segments"]) == 2
    first, second = result["segments"]
    assert [len(first["turns"]), len(second["turns"])] == [1, 2]
    assert second["started_by"].startswith("the agent's history differs")
    assert result["tokens"] == second
    _check_tokens(result, llm, AutoTokenizer.from_pretrained(str(tiny_model)))
    # The sandbox had no network: the tool ran there, and the model saw its output.
    # The messages are what the model saw: the first tool result reached it only inside the
    # summary that began the second segment.
    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert [t["content"].strip() for t in tools] == ["42"]
    summaries = [m for m in result["messages"] if "What the tools showed so far" in str(m)]
    assert len(summaries) == 1 and "42" in summaries[0]["content"]
    logs = result["turn_log"]
    assert [log["segment"] for log in logs] == [0, 1, 1]
    assert all(log["mode"] == "token" for log in logs)
    notes = [m for m in result["messages"] if m.get("name") == "rollserve.segment"]
    assert len(notes) == 1
    # What the agent asked (its temperature) is honoured where the job sets nothing.
    assert [log["info"]["sampling"]["temperature"] for log in logs] == [0.7, 0.7, 0.7] or stream


@pytest.mark.parametrize("backend", ["bwrap", "apptainer"])
def test_an_agent_on_the_standard_library_on_each_sandbox_backend(
    running: Callable[..., tuple[Server, ScriptedLLMServer]], tiny_model: Path, backend: str
) -> None:
    """The gateway's socket and relay reach the agent on both backends: no mount, the host's
    own ``python3``; a tool call, then a rewritten history (two segments)."""
    from transformers import AutoTokenizer

    require(SandboxManager(Settings()), backend)
    turns = [TURNS[0], TURNS[-1]]
    server, llm = running(turns, default_sandbox_backend=backend)
    result = _job(server, STDLIB_AGENT, None)
    assert result["reward"] == 1.0 and result["agent_run"]["exit_code"] == 0
    assert result["agent_run"]["stdout_tail"] == "The answer is \\boxed{42}.\n"
    assert [len(s["turns"]) for s in result["segments"]] == [1, 1]
    # The tool ran in the sandbox and its output reached the model in the rewritten history.
    users = [m["content"] for m in result["messages"] if m["role"] == "user"]
    assert users == ["What is 6*7?", "What is 6*7? A tool printed: 42\n"]
    _check_tokens(result, llm, AutoTokenizer.from_pretrained(str(tiny_model)), turns)


def test_a_backend_without_a_tokenizer_is_passed_through_as_text_turns(
    server_factory: Callable[..., Server],
) -> None:
    """Text mode: the call goes to the backend's chat endpoint as the agent sent it (with the
    job's model), the answer comes back as the backend gave it, and the turns are recorded as
    text, with no tokens."""
    server = server_factory(run_timeout_s="60")
    server.start()
    turns = [TURNS[0], TURNS[-1]]
    with ScriptedLLMServer(turns, model="hosted", native_tool_calls=True) as llm:
        register_backend(server, kind="openai", url=llm.url, model="hosted")
        result = _job(server, STDLIB_AGENT, None, model="hosted")
        sent = [body for path, body in llm.requests if path.endswith("/chat/completions")]
    assert result["reward"] == 1.0 and result["agent_run"]["model_calls"] == 2
    assert result["tokens"] is None and result["segments"] == []
    assert [log["mode"] for log in result["turn_log"]] == ["text", "text"]
    assert [body["model"] for body in sent] == ["hosted", "hosted"]  # not the agent's "mine"
    assert sent[1]["messages"][-1]["content"] == "What is 6*7? A tool printed: 42\n"
    assert result["messages"][-1]["content"] == "The answer is \\boxed{42}."


@pytest.mark.slow
def test_job_sampling_wins_and_stop_strings_cut_the_reply(
    agents: Path, running: Callable[..., tuple[Server, ScriptedLLMServer]], tiny_model: Path
) -> None:
    from transformers import AutoTokenizer

    rambling = {"content": "The answer is \\boxed{42}.\nObservation: 41, no, 43"}
    server, llm = running([*TURNS[:-1], rambling])
    command = [PYTHON, AGENT, "--stop", "\nObservation:"]
    result = _job(server, {"command": command}, agents, sampling={"temperature": 1.0})
    assert result["reward"] == 1.0
    logs = result["turn_log"]
    assert {log["info"]["sampling"]["temperature"] for log in logs} == {1.0}
    # The agent's stop string: sent to the backend, recorded, and the reply cut before it.
    assert all(log["info"]["sampling"]["stop"] == ["\nObservation:"] for log in logs)
    sent = [body for path, body in llm.requests if path.endswith("/completions")][1:]
    assert all(body["stop"] == ["\nObservation:"] for body in sent)
    assert result["messages"][-1]["content"] == "The answer is \\boxed{42}."
    assert "final: The answer is \\boxed{42}.\n" in result["agent_run"]["stdout_tail"]
    assert result["segments"] == []  # one segment: tokens holds it all
    tokens = result["tokens"]
    assert len(tokens["turns"]) == 3
    # What the policy generated past the stop string is still in the trajectory, as generated.
    last = tokens["turns"][-1]["generation"]
    ids = tokens["prompt_ids"] + tokens["response_ids"]
    mask = [0] * len(tokens["prompt_ids"]) + tokens["response_mask"]
    assert set(mask[last["start"] : last["end"]]) == {1}
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    text = llm.turn_text(ScriptedTurn.model_validate(rambling))
    expected = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert ids[last["start"] : last["end"]] == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("misbehaviour", "exit_reason"),
    [
        ("crash", "agent_error"),
        ("no-model", "no_model_call"),
        ("hang", "timeout"),
        ("flood", "submitted"),
        ("malformed", "submitted"),
    ],
)
def test_misbehaving_agents_are_outcomes(
    agents: Path,
    running: Callable[..., tuple[Server, ScriptedLLMServer]],
    misbehaviour: str,
    exit_reason: str,
) -> None:
    server, _ = running(TURNS)
    extra = {"timeouts": {"run_s": 5}} if misbehaviour == "hang" else {}
    result = _job(
        server, {"command": [PYTHON, AGENT, "--misbehave", misbehaviour]}, agents, **extra
    )
    assert result["exit_reason"] == exit_reason
    run = result["agent_run"]
    if misbehaviour == "crash":
        assert run["exit_code"] == 1 and "the agent crashed" in run["stderr_tail"]
        assert result["reward"] == 0.0
    elif misbehaviour == "no-model":
        assert run["model_calls"] == 0 and result["tokens"] is None
    elif misbehaviour == "hang":
        assert run["exit_code"] is None and run["ended_by"] == "timeout"
    elif misbehaviour == "flood":
        assert run["output_truncated"] and result["reward"] == 1.0
    else:
        assert run["refused_calls"] == 1 and "refused: 400" in run["stdout_tail"]
        assert "messages[0].role must be" in run["stdout_tail"] and result["reward"] == 1.0


@pytest.mark.slow
def test_limits_end_the_episode_at_the_gateway(
    agents: Path, running: Callable[..., tuple[Server, ScriptedLLMServer]]
) -> None:
    server, _ = running(TURNS)
    result = _job(server, {"command": [PYTHON, AGENT], "max_turns": 2}, agents)
    assert result["exit_reason"] == "max_turns"
    run = result["agent_run"]
    assert run["model_calls"] == 2 and run["ended_by"] == "max_turns"
    assert len(result["turn_log"]) == 2


@pytest.mark.slow
def test_a_key_is_refused_once_its_job_ended(
    agents: Path, running: Callable[..., tuple[Server, ScriptedLLMServer]]
) -> None:
    server, _ = running(TURNS)
    command = [PYTHON, "-c", "import os; print(os.environ['OPENAI_API_KEY'])"]
    result = _job(server, {"command": command}, agents)
    key = result["agent_run"]["stdout_tail"].strip()
    late = httpx.post(
        f"{server.url}/v1/gateway/{key}/v1/chat/completions",
        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert late.status_code == 410
    error = late.json()["error"]
    assert error["code"] == "job_ended" and "no longer running" in error["message"]
    unknown = httpx.get(f"{server.url}/v1/gateway/not-a-key/v1/models")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_key"
