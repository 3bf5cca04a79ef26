"""What the gateway answers instead of a completion: a refusal, as an OpenAI-style error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollserve.schema.openai import ErrorType, error_body


@dataclass
class Refusal(Exception):
    """A call the gateway answers with an OpenAI-style error instead of a completion."""

    status: int
    message: str
    code: str
    type: ErrorType = "invalid_request_error"
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)
