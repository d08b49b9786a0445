"""Shared pieces of the model: the JSON type, the frozen base model, identifiers, time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, JsonValue, TypeAdapter
from pydantic_core import CoreSchema, core_schema

from flowstream.errors import InvalidIdentifierError

__all__ = [
    "JSON",
    "JSON_FIELD",
    "FrozenModel",
    "canonical_json",
    "json_equal",
    "json_value",
    "utc",
    "validate_identifier",
    "validate_run_id",
]

_JSON_VALUE: TypeAdapter[JsonValue] = TypeAdapter(JsonValue)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON built of the exact JSON types alone (no subclass, no tuple):
    what pydantic's ``JsonValue`` takes as it is. (Loops, not ``all()`` over a generator: this
    runs for every payload.)"""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is list:
        for item in value:  # noqa: SIM110 (no generator: this runs for every payload)
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain(item)):
                return False
        return True
    return False


def json_value(value: Any) -> JsonValue:
    """``value`` validated as pydantic's ``JsonValue``. Plain JSON (nearly every payload) is
    checked in one pass and kept as it is; anything else goes through ``JsonValue`` itself, with
    its conversions and its errors. ``JsonValue``'s own validation and serialisation call a
    Python function for every value in a payload (its union's discriminator), a few percent of
    the engine's CPU."""
    kind = type(value)
    if kind in _SCALARS:
        return value  # type: ignore[no-any-return]  # (no cast(): a call for every payload)
    if kind is dict:  # the top level here, the nested levels in ``_plain``
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain(item)):
                return _JSON_VALUE.validate_python(value)
        return value  # type: ignore[no-any-return]
    if _plain(value):
        return value  # type: ignore[no-any-return]
    return _JSON_VALUE.validate_python(value)


class _JsonField:
    """What makes ``Any`` a model's ``JSON``: validated by ``json_value``, serialised by each
    value's own type (no Python call), described in JSON Schema as any value."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            json_value, serialization=core_schema.simple_ser_schema("any")
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        return {}


#: The metadata of a ``JSON`` field (``datum`` tells such fields by it).
JSON_FIELD = _JsonField()

if TYPE_CHECKING:
    JSON = JsonValue
else:
    JSON = Annotated[Any, JSON_FIELD]

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")
_MAX_ID_LEN = 200
#: What an id must not hold: a control character (below U+0020).
_CONTROL = re.compile(r"[\x00-\x1f]")


class FrozenModel(BaseModel):
    """Base of every model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON used in determinism diffs (``history=…; replay=…``)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def json_equal(left: Any, right: Any) -> bool:
    """JSON equality that tells types apart (``true`` is not ``1``, ``1.0`` is not ``1``)."""
    if left is right:
        return True
    try:
        return bool(
            orjson.dumps(left, option=orjson.OPT_SORT_KEYS)
            == orjson.dumps(right, option=orjson.OPT_SORT_KEYS)
        )
    except TypeError:
        return bool(left == right)


def validate_run_id(run_id: str) -> str:
    """Run ids are 1–200 characters of ``[A-Za-z0-9_-]`` (they become Kafka keys and paths)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise InvalidIdentifierError(
            f"invalid run id {run_id!r}: use 1-200 characters of letters, digits, '-' and '_'"
        )
    return run_id


def validate_identifier(kind: str, value: str) -> str:
    """Step, wait, hook, signal and child ids: non-empty, at most 200 chars, no control chars."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _MAX_ID_LEN
        or _CONTROL.search(value) is not None
    ):
        raise InvalidIdentifierError(
            f"invalid {kind} id {value!r}: use 1-{_MAX_ID_LEN} printable characters"
        )
    return value


def utc(moment: datetime) -> datetime:
    """Return ``moment`` as an aware UTC datetime; naive values are rejected."""
    if moment.tzinfo is None:
        raise ValueError("datetimes must be timezone-aware (UTC)")
    return moment.astimezone(UTC)
