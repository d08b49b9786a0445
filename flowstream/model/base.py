"""Shared pieces of the model: the JSON type, the frozen base model, identifiers, time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, JsonValue

from flowstream.errors import InvalidIdentifierError

__all__ = [
    "JSON",
    "FrozenModel",
    "canonical_json",
    "json_equal",
    "utc",
    "validate_identifier",
    "validate_run_id",
]

JSON = JsonValue

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
