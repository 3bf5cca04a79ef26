"""Faults of inference backends, injected under a real ``rollserve serve`` process with the
scripted LLM server (a test double that replays given turns over real HTTP): the server killed
or its connection reset mid-generation, garbage answers (not JSON, an HTML page with 200, JSON
of the wrong shape), a hang or a trickle past ``llm_request_timeout_s``, token ids outside the
vocabulary, logprobs that do not match the ids — in token mode (vLLM ``/v1/completions`` with
token ids, SGLang ``/generate``) and, where it applies, text mode (``/v1/chat/completions``).

Each fault ends either in a correct recovery (the turn fails over to a healthy backend and the
trajectory is exact) or in ``status=failed`` after the configured failovers and retries, with
an error naming the backend and what was wrong — never in a corrupted trajectory or a reward
computed from garbage. After each, no sandbox or process is left and the service answers.
(Unknown finish reasons are tests/llm/test_protocol_edges.py's.)"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.llm.templates import ChatTemplate
from rollserve.testing.scripted import (
    Drop,
    Fault,
    RawAnswer,
    ScriptedLLMServer,
    ScriptedTurn,
    Stall,
    Trickle,
)
from tests.integration.conftest import Server

MAX_ATTEMPTS = 2  # tries of a job
FAILOVERS = 2  # backends (here: tries of the one backend, re-admitted) one turn may try
SETTINGS = {
    "llm_request_timeout_s": "1",
    "max_attempts": str(MAX_ATTEMPTS),
    "retry_backoff_s": "1",  # by then the failed attempt's worker has let go of the job
    "llm_failover_attempts": str(FAILOVERS),
    "llm_wait_s": "1",
    "llm_health_interval_s": "0.2",  # an ejected backend that answers is re-admitted soon
    "llm_drain_s": "0.5",
    "run_workers": "8",
}
MODES = ["vllm", "sglang", "text"]

PROBE = {"content": "ok"}  # what a token-mode registration's probe generates
BASH = {
    "content": "Let me compute it.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7))"}}],
}
SUBMIT = {"content": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]}
HTML = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"

Change = Callable[[str, dict[str, Any]], "dict[str, Any] | Fault"]
"""``(path, answer) → answer or fault``: what a broken backend makes of a generation answer."""


class TurnFault:
    """A scripted server's rewrite: ``change`` applied to its answers to turn ``first`` and
    later of each episode (a turn's number is read from its prompt; the registration's probe
    is turn 0); ``hits`` counts them."""

    def __init__(self, change: Change, first: int, im_start: int) -> None:
        self.change, self.first, self.im_start = change, first, im_start
        self.hits = 0
        self._lock = threading.Lock()

    def turn(self, path: str, body: dict[str, Any]) -> int:
        if path.endswith("/chat/completions"):
            return 1 + sum(m.get("role") == "assistant" for m in body["messages"])
        ids = body["prompt"] if path == "/v1/completions" else body["input_ids"]
        return int((ids.count(self.im_start) - 1) // 2)  # system+user, then reply+observation

    def __call__(self, path: str, body: dict[str, Any], answer: dict[str, Any]) -> Any:
        if self.turn(path, body) < self.first:
            return answer
        with self._lock:
            self.hits += 1
        return self.change(path, answer)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``rollserve serve`` for the module, with short timeouts and few retries; each test
    has models and backends of its own."""
    root = tmp_path_factory.mktemp("faults")
    server = Server(root / "data", {f"ROLLSERVE_{k.upper()}": v for k, v in SETTINGS.items()})
    server.start()
    yield server
    server.stop()


class Rig:
    """One test's backends and jobs on the shared service."""

    def __init__(self, service: Server, model: str, tokenizer: Path) -> None:
        from transformers import AutoTokenizer

        self.service, self.model, self.tokenizer = service, model, tokenizer
        self.im_start = AutoTokenizer.from_pretrained(str(tokenizer)).convert_tokens_to_ids(
            "<|im_start|>"
        )
        self.http = httpx.Client(base_url=service.url, timeout=60)
        self.servers: list[ScriptedLLMServer] = []
        self.backends: list[str] = []
        self._jobs = itertools.count()

    def fault(self, change: Change, first: int = 1) -> TurnFault:
        return TurnFault(change, first, self.im_start)

    def backend(
        self,
        name: str,
        mode: str,
        turns: list[dict[str, Any]],
        *,
        fault: TurnFault | None = None,
        model: str | None = None,
        weight: float = 1.0,
    ) -> ScriptedLLMServer:
        """A scripted server replaying ``turns``, registered as a backend of ``mode``."""
        model = model or self.model
        token = mode != "text"
        llm = ScriptedLLMServer(
            ([PROBE] if token else []) + turns,
            model=model,
            tokenizer=self.tokenizer if token else None,
            rewrite=fault,
        ).start()
        self.servers.append(llm)
        spec: dict[str, Any] = {
            "id": f"{model}-{name}",
            "kind": "openai" if mode == "text" else mode,
            "url": llm.url,
            "model": model,
            "weight": weight,
        }
        if token:
            spec["tokenizer"] = str(self.tokenizer)
        # The rig's 1 s request timeout is for the faults: on a machine busy with the other
        # suites, the registration's GET /models may miss it, and is asked again.
        for _ in range(3):
            answer = self.http.post("/v1/llm/backends", json=spec)
            if "no complete answer within" not in answer.text:
                break
        assert answer.status_code == 201, answer.text
        self.backends.append(spec["id"])
        return llm

    def submit(self, model: str | None = None) -> str:
        job_id = f"{model or self.model}-job{next(self._jobs)}"
        task = {"task_id": job_id, "kind": "math", "prompt": "What is 6*7?", "answer": "42"}
        job = {
            "job_id": job_id,
            "task": task,
            "model": model or self.model,
            "agent": {"name": "tool", "max_turns": 4},
            "sampling": {"max_tokens": 200},
        }
        answer = self.http.post("/v1/jobs", json=job)
        assert answer.status_code == 202, answer.text
        return job_id

    def wait(self, job_id: str) -> dict[str, Any]:
        """The job's final view: it ended (never stuck), once, in the results feed."""
        view: dict[str, Any] = self.http.get(
            f"/v1/jobs/{job_id}", params={"wait": 60}, timeout=70
        ).json()
        assert view["status"] in ("completed", "failed"), view
        feed = self.http.get("/v1/results", params={"limit": 1000}).json()["results"]
        assert [r["status"] for r in feed if r["job_id"] == job_id] == [view["status"]]
        return view

    def run(self) -> dict[str, Any]:
        return self.wait(self.submit())

    def close(self) -> None:
        for backend in self.backends:
            self.http.delete(f"/v1/llm/backends/{backend}")
        for llm in self.servers:
            llm.kill()  # a stalled request would hold up a graceful stop
        self.http.close()


@pytest.fixture
def rig(service: Server, tiny_model: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    callspec = getattr(request.node, "callspec", None)
    model = f"m{next(_serial)}" + (f"-{callspec.id}" if callspec is not None else "")
    made = Rig(service, model, tiny_model)
    try:
        yield made
        _assert_clean(made)
    finally:
        made.close()


_serial = itertools.count()


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that just ended
            if int(stat.read_text().rpartition(")")[2].split()[1]) == parent:
                found.append(int(stat.parent.name))
    return found


def _assert_clean(rig: Rig) -> None:
    """No sandbox state directory or sandbox process left; the service answers."""
    proc, boxes = rig.service.proc, rig.service.data_dir / "sandboxes"
    assert proc is not None and proc.poll() is None, "the service died"
    _until(lambda: not _children(proc.pid) and not (boxes.is_dir() and any(boxes.iterdir())), 10)
    assert rig.http.get("/healthz").status_code == 200
    status = rig.http.get("/v1/status")
    assert status.status_code == 200, status.text


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


# -- what a broken backend answers ------------------------------------------------------------


def _const(fault: Fault) -> Change:
    return lambda path, answer: fault


def _bad_id(value: Any) -> Change:
    """The first generated id replaced (SGLang's ids are in ``[logprob, id, text]``)."""

    def change(path: str, answer: dict[str, Any]) -> dict[str, Any]:
        if path == "/generate":
            answer["meta_info"]["output_token_logprobs"][0][1] = value
        else:
            answer["choices"][0]["token_ids"][0] = value
        return answer

    return change


def _logprobs(edit: Callable[[list[Any]], list[Any]]) -> Change:
    def change(path: str, answer: dict[str, Any]) -> dict[str, Any]:
        logprobs = answer["choices"][0]["logprobs"]
        logprobs["token_logprobs"] = edit(logprobs["token_logprobs"])
        return answer

    return change


def _as_raw(change: Change) -> Change:
    """The changed answer written by Python's json, which writes NaN and Infinity."""

    def raw(path: str, answer: dict[str, Any]) -> Fault:
        changed = change(path, answer)
        return RawAnswer(json.dumps(changed), media_type="application/json")

    return raw


_DELETE = object()


def _edit(key: str, value: Any = _DELETE) -> Change:
    """The answer with one entry (``choices.0.token_ids``: a path into it) set to ``value``,
    or deleted."""

    def change(path: str, answer: dict[str, Any]) -> dict[str, Any]:
        *parents, last = (int(part) if part.isdigit() else part for part in key.split("."))
        node: Any = answer
        for part in parents:
            node = node[part]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
        return answer

    return change


# -- outcomes ---------------------------------------------------------------------------------


def _fail_each(
    rig: Rig, mode: str, cases: dict[str, Change], first: int = 1
) -> dict[str, tuple[dict[str, Any], TurnFault]]:
    """One backend, always broken from turn ``first`` on, and one job per case, all at once:
    each job's final view and its fault."""
    jobs = {}
    for case, change in cases.items():
        model = f"{rig.model}-{case}"
        fault = rig.fault(change, first)
        rig.backend("only", mode, [BASH] * 12, fault=fault, model=model)
        jobs[case] = (rig.submit(model), fault)
    return {case: (rig.wait(job_id), fault) for case, (job_id, fault) in jobs.items()}


def _assert_failed(view: dict[str, Any], fault: TurnFault | None, *phrases: str) -> None:
    """Failed after every failover and attempt, with an error that names the backend and what
    was wrong; no result, so no reward at all."""
    assert view["status"] == "failed", view
    assert view["result"] is None and view["attempts"] == MAX_ATTEMPTS, view
    error = view["error"]
    assert error["code"] == "backend_unavailable", error
    for phrase in phrases:
        assert phrase in error["message"], (phrase, error)
    if fault is not None:
        assert fault.hits == MAX_ATTEMPTS * FAILOVERS, fault.hits


def _assert_exact(view: dict[str, Any], rig: Rig, mode: str, healthy: ScriptedLLMServer) -> None:
    """Completed and rewarded; in token mode the trajectory's arrays agree, its ids are in the
    vocabulary, it is exactly what the healthy backend saw last plus what it generated, and
    its turns name the backends that generated them."""
    assert view["status"] == "completed", view
    result = view["result"]
    assert result["reward"] == 1.0 and result["exit_reason"] == "submitted", result
    if mode == "text":
        assert result["tokens"] is None
        assert [m["role"] for m in result["messages"]][-2:] == ["assistant", "tool"]
        return
    tokens = result["tokens"]
    response = tokens["response_ids"]
    assert len(response) == len(tokens["response_mask"]) == len(tokens["response_logprobs"])
    tokenizer = healthy.tokenizer
    assert tokenizer is not None
    vocab = len(tokenizer)  # type: ignore[arg-type]
    assert all(type(i) is int and 0 <= i < vocab for i in tokens["prompt_ids"] + response)
    path, last = healthy.requests[-1]
    sent = last["prompt"] if path == "/v1/completions" else last["input_ids"]
    text = healthy.turn_text(ScriptedTurn.model_validate(SUBMIT))
    generated = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert tokens["prompt_ids"] + response == sent + generated
    assert sum(tokens["response_mask"]) == sum(t["generated_tokens"] for t in tokens["turns"])
    backends = [t["backend_id"] for t in tokens["turns"]]
    assert backends == [f"{rig.model}-broken", f"{rig.model}-healthy"]


def _failover(rig: Rig, mode: str, change: Change) -> None:
    """The preferred backend breaks at the second turn, a healthy one takes the turn over."""
    broken = rig.fault(change, first=2)
    rig.backend("broken", mode, [BASH, SUBMIT], fault=broken, weight=100.0)
    healthy = rig.backend("healthy", mode, [SUBMIT], weight=0.01)
    _assert_exact(rig.run(), rig, mode, healthy)
    assert broken.hits == 1


# -- 1. killed mid-generation -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_backend_killed_mid_generation_fails_over(rig: Rig, mode: str) -> None:
    """The server dies with the second turn in flight: the turn goes to the other backend."""
    broken = rig.fault(_const(Stall(30)), first=2)
    dying = rig.backend("broken", mode, [BASH, SUBMIT], fault=broken, weight=100.0)
    healthy = rig.backend("healthy", mode, [SUBMIT], weight=0.01)
    job_id = rig.submit()
    _until(lambda: broken.hits == 1)
    dying.kill()
    _assert_exact(rig.wait(job_id), rig, mode, healthy)


@pytest.mark.parametrize("mode", MODES)
def test_a_connection_reset_mid_generation_fails_the_job(rig: Rig, mode: str) -> None:
    [(view, fault)] = _fail_each(rig, mode, {"reset": _const(Drop())}, first=2).values()
    _assert_failed(view, fault, f"{rig.model}-reset-only", "RemoteProtocolError")


def test_a_dead_backend_fails_the_job_naming_it(rig: Rig) -> None:
    rig.backend("dead", "sglang", [BASH]).kill()
    _assert_failed(rig.run(), None, f"{rig.model}-dead", "ConnectError")


# -- 2. garbage -------------------------------------------------------------------------------

_SHAPES: dict[str, dict[str, Change]] = {
    "vllm": {
        "no-choices": _edit("choices"),
        "empty-choices": _edit("choices.0"),
        "no-token-ids": _edit("choices.0.token_ids"),
        "ids-not-a-list": _edit("choices.0", {"token_ids": 7, "finish_reason": "stop"}),
    },
    "sglang": {
        "no-meta-info": _edit("meta_info"),
        "no-logprobs": _edit("meta_info.output_token_logprobs"),
        "pair-cut": _edit("meta_info.output_token_logprobs", [[-0.1]]),
        "pairs-not-a-list": _edit("meta_info.output_token_logprobs", "-0.1 7"),
    },
    "text": {
        "no-choices": _edit("choices"),
        "no-message": _edit("choices.0.message"),
        "content-not-text": _edit("choices.0.message.content", {"text": "42"}),
        "arguments-not-text": _edit(
            "choices.0.message.tool_calls",
            [{"id": "c", "function": {"name": "submit", "arguments": 42}}],
        ),
        "usage-not-object": _edit("usage", "many"),
    },
}


@pytest.mark.parametrize("mode", MODES)
def test_garbage_answers_fail_the_job(rig: Rig, mode: str) -> None:
    cases = {
        "not-json": _const(RawAnswer('{"choices": [{"text": ', media_type="application/json")),
        "html-200": _const(RawAnswer(HTML)),
        "array": _const(RawAnswer("[1, 2, 3]", media_type="application/json")),
        **_SHAPES[mode],
    }
    said = {"not-json": ("not JSON",), "html-200": ("not JSON", "text/html", "502 Bad Gateway")}
    for case, (view, fault) in _fail_each(rig, mode, cases).items():
        _assert_failed(view, fault, f"{rig.model}-{case}-only", *said.get(case, ("malformed",)))


@pytest.mark.parametrize(
    ("mode", "change"),
    [
        ("vllm", _edit("choices.0.token_ids")),
        ("sglang", _edit("meta_info")),
        ("text", _const(RawAnswer(HTML))),
    ],
)
def test_a_garbage_answer_fails_over(rig: Rig, mode: str, change: Change) -> None:
    _failover(rig, mode, change)


# -- 3. hangs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_hang_past_the_request_timeout_fails_over(rig: Rig, mode: str) -> None:
    _failover(rig, mode, _const(Stall(3)))


@pytest.mark.parametrize("fault", [Stall(3), Trickle(0.02)], ids=["stall", "trickle"])
def test_a_hang_past_the_request_timeout_fails_the_job(rig: Rig, fault: Fault) -> None:
    """A trickle sends a byte at a time, never slow enough for one read to time out: the
    request timeout bounds the whole call."""
    [(view, hits)] = _fail_each(rig, "vllm", {"hung": _const(fault)}, first=2).values()
    _assert_failed(view, hits, f"{rig.model}-hung-only", "no complete answer within 1s")


# -- 4. token ids outside the vocabulary ------------------------------------------------------


@pytest.mark.parametrize("mode", ["vllm", "sglang"])
def test_token_ids_outside_the_vocabulary_fail_the_job(rig: Rig, mode: str) -> None:
    """The tiny model's vocabulary has 678 ids."""
    cases = {
        "negative": _bad_id(-1),
        "vocab-size": _bad_id(678),
        "huge": _bad_id(2**40),
        "float": _bad_id(3.5),
        "string": _bad_id("7"),
        "bool": _bad_id(True),
        "null": _bad_id(None),
    }
    for case, (view, fault) in _fail_each(rig, mode, cases).items():
        _assert_failed(view, fault, f"{rig.model}-{case}-only", "outside the vocabulary")


def test_an_id_outside_the_vocabulary_fails_over(rig: Rig) -> None:
    _failover(rig, "vllm", _bad_id(678))


def test_the_vocabulary_is_the_models_embedding_table(tiny_model: Path, tmp_path: Path) -> None:
    """A model whose embedding table is padded past its tokenizer (Qwen2.5: 151936 rows for
    151665 tokens) may generate ids up to the table's size."""
    padded = tmp_path / "padded"
    shutil.copytree(tiny_model, padded)
    config = json.loads((padded / "config.json").read_text())
    (padded / "config.json").write_text(json.dumps({**config, "vocab_size": 704}))
    assert ChatTemplate(str(tiny_model)).vocab_size == 678
    assert ChatTemplate(str(padded)).vocab_size == 704


# -- 5. logprobs that do not match the ids ----------------------------------------------------


def test_logprobs_that_do_not_match_the_ids_fail_the_job(rig: Rig) -> None:
    """vLLM's ids and logprobs are separate lists (SGLang's come in pairs: 'pair-cut' above)."""
    cases = {
        "fewer": _logprobs(lambda lps: lps[:-1]),
        "more": _logprobs(lambda lps: [*lps, -0.5]),
        "none": _logprobs(lambda lps: []),
        "strings": _logprobs(lambda lps: [str(x) for x in lps]),
        "nan": _as_raw(_logprobs(lambda lps: [float("nan"), *lps[1:]])),
        "infinity": _as_raw(_logprobs(lambda lps: [float("inf"), *lps[1:]])),
    }
    for case, (view, fault) in _fail_each(rig, "vllm", cases).items():
        phrase = "token ids but" if case in ("fewer", "more", "none") else "not numbers"
        _assert_failed(view, fault, f"{rig.model}-{case}-only", phrase)
