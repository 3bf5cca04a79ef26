"""The base of the models a client sends: unknown fields are refused, and a number is a
number (JSON's ``true`` and ``false`` are not taken for 1 and 0)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_NUMBERS = (int, float)


def _numeric(annotation: Any) -> bool:
    if annotation in _NUMBERS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        parts = typing.get_args(annotation)
        return bool not in parts and str not in parts and any(p in _NUMBERS for p in parts)
    return False


class WireModel(BaseModel):
    """A body or part of a body of the HTTP API."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _number_not_boolean(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric(field.annotation):
                raise ValueError(f"{info.field_name} must be a number, not {str(value).lower()}")
        return value
