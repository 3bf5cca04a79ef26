"""The base of the models a client sends: unknown fields are refused, a number is a number
and a boolean a boolean (JSON's ``true`` is not taken for 1, nor ``0`` or ``"yes"`` for a
boolean)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_NUMBERS = (int, float)


def _parts(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _numeric(annotation: Any) -> bool:
    parts = _parts(annotation)
    return bool not in parts and str not in parts and any(p in _NUMBERS for p in parts)


def _boolean(annotation: Any) -> bool:
    return set(_parts(annotation)) <= {bool, type(None)} and bool in _parts(annotation)


class WireModel(BaseModel):
    """A body or part of a body of the HTTP API."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _json_types(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or value is None:
            return value
        if isinstance(value, bool) and _numeric(field.annotation):
            raise ValueError(f"{info.field_name} must be a number, not {str(value).lower()}")
        if not isinstance(value, bool) and _boolean(field.annotation):
            raise ValueError(f"{info.field_name} must be true or false, not {value!r}")
        return value
