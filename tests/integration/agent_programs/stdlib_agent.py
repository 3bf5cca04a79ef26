"""An agent rollserve did not write, on Python's standard library alone (no virtual
environment to make): one tool call, then a fresh conversation that carries what the tool
printed, a history rewrite and so a second token segment. It prints its last reply."""

import json
import os
import subprocess
import urllib.request

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def chat(messages: list[dict]) -> dict:
    body = json.dumps({"model": "mine", "messages": messages, "tools": [BASH]}).encode()
    headers = {
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        "Content-Type": "application/json",
    }
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    with urllib.request.urlopen(urllib.request.Request(url, body, headers)) as answer:
        return json.load(answer)["choices"][0]["message"]


with open(os.environ["ROLLSERVE_TASK_FILE"]) as file:
    task = file.read()
reply = chat([{"role": "user", "content": task}])
command = json.loads(reply["tool_calls"][0]["function"]["arguments"])["command"]
out = subprocess.run(["bash", "-c", command], capture_output=True, text=True).stdout
print(chat([{"role": "user", "content": task + " A tool printed: " + out}])["content"])
