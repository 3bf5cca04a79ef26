"""The code a submission contributes: taken from the run (the submit tool's answer, or the last
```python block of the model's last message) and assembled into the program that is judged."""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

from rollserve.schema.run import RunOutput

# Runs a function task's program the way HumanEval's harness does (as a module that is not
# __main__, so a main guard stays quiet), then prints the marker it was given: a program that
# leaves early (sys.exit, os._exit) never prints it. A syntax error is reported without a
# traceback header, as for a script.
RUNNER = """\
import sys, traceback, types
path, marker = sys.argv[1], sys.argv[2]
del sys.argv[1:]
with open(path, encoding="utf-8") as fh:
    source = fh.read()
try:
    code = compile(source, path, "exec")
except SyntaxError as exc:
    sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
    sys.exit(1)
module = types.ModuleType("__candidate__")
module.__file__ = path
sys.modules[module.__name__] = module
exec(code, module.__dict__)
del path, source, code, module
print(marker)
"""
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_LEADING_FENCE = re.compile(r"\A\s*```[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)


def function_program(prompt_code: str, code: str, entry_point: str) -> str:
    """The candidate program the HumanEval way: a body continues ``prompt_code``; a submission
    that defines ``entry_point`` itself comes after ``prompt_code`` (for its imports and
    helpers) when that compiles on its own, else stands alone."""
    if not prompt_code.endswith("\n"):
        prompt_code += "\n"
    if not defines(code, entry_point):
        return prompt_code + code
    return f"{prompt_code}\n{code}" if _compiles(prompt_code) else code


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines ``name`` at module level (``def``, ``class`` or assignment)."""
    escaped = re.escape(name)
    pattern = rf"^(?:(?:async\s+)?def\s+{escaped}\s*\(|class\s+{escaped}\b|{escaped}\s*=(?!=))"
    return re.search(pattern, code, re.MULTILINE) is not None


def _compiles(source: str) -> bool:
    """Whether trusted task text (never a submission) is valid Python on its own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(source)
        except (SyntaxError, ValueError):
            return False
    return True


def submitted_code(output: RunOutput) -> tuple[str | None, str | None]:
    """The code and where it came from: the submit tool's answer (``"submit"``; a Markdown
    fence around it is removed), else the last ```python block of the last assistant message
    (``"fenced"``); else ``(None, None)``."""
    if output.submission is not None and output.submission.strip():
        fenced = _LEADING_FENCE.match(output.submission)
        return (fenced.group(1) if fenced else output.submission), "submit"
    for message in reversed(output.messages):
        if message.get("role") == "assistant":
            blocks = _FENCE.findall(_text(message.get("content")))
            return (blocks[-1], "fenced") if blocks else (None, None)
    return None, None


def _text(content: Any) -> str:
    """The text of an OpenAI message content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
