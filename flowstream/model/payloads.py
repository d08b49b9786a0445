"""Typed payloads: application values in, JSON in history, application values out.

History stores JSON. Wherever a payload is written (a start's input, a step's input and output,
a completion, a signal or hook payload, a child's input) application code may hand over a
pydantic model, a dataclass, or any value pydantic can serialise (``datetime``, ``UUID``, tuples,
enums…); ``to_json`` turns it into the JSON that is stored and compared on replay. On read,
``from_json`` decodes committed JSON into the type an annotation names, through pydantic's
``TypeAdapter`` (so ``dict[str, int]``, ``list[Item]``, ``Model | None`` all work).

A value that does not serialise, or JSON that does not decode as the requested type, is a
``SerializationError``: old history that no longer fits a new type is reported, never papered
over with defaults.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar, cast

import pydantic_core
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from flowstream.errors import SerializationError
from flowstream.model.base import JSON

__all__ = ["Model", "Payload", "from_json", "to_json"]

T = TypeVar("T")

#: What a writer may hand over as a payload: JSON, or any value ``to_json`` serialises.
Payload = object

_PLAIN = (str, int, float, bool, type(None))


class Model(BaseModel):
    """A base for payload models: a frozen pydantic model that refuses unknown fields (so old
    history that no longer fits is reported, not silently read)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def to_json(value: object, what: str = "payload") -> JSON:
    """``value`` as the JSON history stores (models and dataclasses dumped in JSON mode)."""
    if isinstance(value, _PLAIN):
        return value
    try:
        json: JSON = pydantic_core.to_jsonable_python(value)  # (no cast(): a call per payload)
        return json
    except pydantic_core.PydanticSerializationError as exc:
        raise SerializationError(
            f"{what} of type {type(value).__name__} cannot be stored as JSON: {exc}"
        ) from None


@lru_cache(maxsize=1024)
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def from_json(kind: type[T] | Any, value: JSON, what: str = "payload") -> T:
    """Decode committed JSON ``value`` as ``kind`` (a model, dataclass or any type hint)."""
    if kind is Any or kind is object:
        return cast(T, value)
    hint: Any = kind
    try:
        adapter = _adapter(hint)
    except TypeError:  # an unhashable hint (rare): build the adapter each time
        adapter = TypeAdapter(kind)
    try:
        return cast(T, adapter.validate_python(value))
    except ValidationError as exc:
        name = getattr(kind, "__name__", repr(kind))
        raise SerializationError(f"{what} does not decode as {name}: {exc}") from None
