"""An agent as a team writes it on the official ``openai`` SDK, knowing nothing of rollserve:
a function-calling loop with one ``bash`` tool, reading its task from ROLLSERVE_TASK_FILE and
its endpoint from OPENAI_BASE_URL / OPENAI_API_KEY (the SDK's own variables).

  --stream         ask for server-sent events and put the reply together from the chunks
  --summarize N    after N tool results, replace the history by a summary (a new segment)
  --answer-file    write the final reply to ROLLSERVE_ANSWER_FILE as well
  --stop S         ask the model to stop at the string S
  --misbehave W    crash | no-model | hang | flood | malformed | late"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from openai import BadRequestError, OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command and see its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def complete(client: OpenAI, messages: list[dict], stream: bool, stop: list[str]) -> dict:
    """One turn as an assistant message dict (what the SDK returns, as the agent keeps it)."""
    if not stream:
        answer = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, temperature=0.7, stop=stop or None
        )
        return answer.choices[0].message.model_dump(exclude_none=True)
    content, calls = "", {}
    with client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
        stop=stop or None,
    ) as events:
        for chunk in events:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
    message: dict = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for _, c in sorted(calls.items())
        ]
    return message


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--summarize", type=int, default=0)
    parser.add_argument("--answer-file", action="store_true")
    parser.add_argument("--misbehave", default="")
    parser.add_argument("--stop", action="append", default=[])
    args = parser.parse_args()
    with open(os.environ["ROLLSERVE_TASK_FILE"]) as file:
        task = file.read()
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    if args.misbehave == "crash":
        raise RuntimeError("the agent crashed before its first call")
    if args.misbehave == "no-model":
        print("nothing to ask")
        return 0
    if args.misbehave == "hang":
        time.sleep(3600)
    if args.misbehave == "flood":
        sys.stdout.write("x" * 2_000_000 + "\n")
    if args.misbehave == "malformed":
        try:
            client.chat.completions.create(model="policy", messages=[{"role": "robot"}])
        except BadRequestError as exc:
            print(f"refused: {exc.status_code} {exc.body}")
    system = {"role": "system", "content": "Solve the task with the bash tool, then answer."}
    messages: list[dict] = [system, {"role": "user", "content": task}]
    results = 0
    for _ in range(20):
        reply = complete(client, messages, args.stream, args.stop)
        messages.append(reply)
        if not reply.get("tool_calls"):
            if args.answer_file:
                with open(os.environ["ROLLSERVE_ANSWER_FILE"], "w") as file:
                    file.write(reply.get("content") or "")
            print(f"final: {reply.get('content')}")
            return 0
        for call in reply["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(command, shell=True, capture_output=True, text=True)
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr}
            )
            results += 1
        if args.summarize and results == args.summarize:
            seen = "\n".join(m["content"] for m in messages if m["role"] == "tool")
            summary = f"{task}\n\nWhat the tools showed so far:\n{seen}"
            messages = [system, {"role": "user", "content": summary}]
    return 1


if __name__ == "__main__":
    sys.exit(main())
