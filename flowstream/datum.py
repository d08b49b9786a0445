"""Conversion between pydantic models and Avro datums, checked once against the schema.

A :class:`RecordPlan` is built from a model class and the record of a resolved Avro schema
document (every named type's ``name`` a full name, defined inline at first use). Building it
checks that the model and the record agree field by field, so a field missing on one side
fails at start-up instead of being dropped or defaulted on the wire. The plan then converts
only the fields that need it:

* JSON values (``JsonValue``) ↔ ``bytes`` of orjson-encoded JSON;
* aware ``datetime`` → ``timestamp-micros`` (naive datetimes are refused, not guessed);
* ``SecretStr`` → its value (the schema says why the field is clear text);
* nested models, tuples of models, and a union of tagged models, which becomes an Avro union
  of records whose branch name carries the ``type`` discriminator.

Everything else (strings, ints, bools, bytes, enums, literals, tuples of strings) is passed as
is. This module does not import fastavro; :mod:`flowstream.codec` does the Avro part.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from inspect import isclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, JsonValue, SecretStr
from pydantic.fields import FieldInfo

from flowstream.errors import SerializationError
from flowstream.model.base import JSON_FIELD

__all__ = ["Convert", "RecordPlan", "SchemaMismatchError", "dump_json", "load_json", "plan"]

Convert = Callable[[Any], Any]
_NULL = b"null"


class SchemaMismatchError(SerializationError):
    """A model and its Avro schema disagree; raised when the codec is built."""


def dump_json(value: JsonValue) -> bytes:
    """orjson-encode a JSON value; NaN, infinities and ints beyond 64 bits are refused."""
    if value is None:
        return _NULL
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:  # orjson.JSONEncodeError
        raise SerializationError(f"value is not encodable as JSON: {exc}") from None
    # orjson writes NaN and ±Infinity as null; only then can the output hold a null the value
    # did not, so the walk is needed only when a null appears.
    if _NULL in encoded and _has_non_finite(value):
        raise SerializationError("JSON values cannot hold NaN or Infinity")
    return encoded


def load_json(data: bytes) -> JsonValue:
    """Decode orjson-encoded JSON."""
    value: JsonValue = orjson.loads(data)
    return value


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_has_non_finite(item) for item in value)
    if isinstance(value, dict):
        return any(_has_non_finite(item) for item in value.values())
    return False


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise SerializationError(
            f"naive datetime {moment.isoformat()}: use a timezone-aware (UTC) datetime"
        )
    return moment


def _reveal(secret: SecretStr) -> str:
    return secret.get_secret_value()


def _optional(convert: Convert) -> Convert:
    def optional(value: Any) -> Any:
        return None if value is None else convert(value)

    return optional


def _each(convert: Convert) -> Convert:
    def each(values: Any) -> Any:
        return [convert(value) for value in values]

    return each


@dataclass(frozen=True, slots=True)
class RecordPlan:
    """How one model class maps onto one Avro record."""

    model: type[BaseModel]
    name: str
    tag: str | None
    encoders: tuple[tuple[str, Convert], ...]
    decoders: tuple[tuple[str, Convert], ...]

    def to_datum(self, value: BaseModel) -> dict[str, Any]:
        """The Avro datum of ``value`` (a tagged model's ``type`` stays in and is ignored)."""
        datum = value.__dict__.copy()
        for name, convert in self.encoders:
            datum[name] = convert(datum[name])
        return datum

    def from_datum(self, datum: dict[str, Any]) -> dict[str, Any]:
        """The input for ``model.model_validate`` (converts ``datum`` in place)."""
        for name, convert in self.decoders:
            datum[name] = convert(datum[name])
        if self.tag is not None:
            datum["type"] = self.tag
        return datum


def plan(model: type[BaseModel], record: Mapping[str, Any], *, tagged: bool = False) -> RecordPlan:
    """Check ``model`` against the resolved Avro ``record`` and return its plan.

    ``tagged`` says the model's ``type`` literal is carried by the record name, not a field.
    """
    return _Planner(record).record(model, record, tagged=tagged)


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _annotation(field: FieldInfo) -> Any:
    """A field's type, ``JsonValue`` for a field of the model's ``JSON`` (a validator on
    ``Any``, its marker kept apart from the annotation by pydantic)."""
    if any(m is JSON_FIELD for m in field.metadata):
        return JsonValue
    return field.annotation


def _union_args(annotation: Any) -> tuple[Any, ...] | None:
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(_unwrap(arg) for arg in get_args(annotation))
    return None


def _tag_of(model: type[BaseModel]) -> str:
    field = model.model_fields.get("type")
    values = get_args(field.annotation) if field is not None else ()
    if field is None or get_origin(field.annotation) is not Literal or len(values) != 1:
        raise SchemaMismatchError(f"{model.__name__} has no single-valued 'type' literal")
    return str(values[0])


class _Planner:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self._named: dict[str, Mapping[str, Any]] = {}
        self._collect(root)

    def _collect(self, node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                self._collect(item)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "enum", "fixed"):
                self._named[node["name"]] = node
            for field in node.get("fields", ()):
                self._collect(field["type"])
            for key in ("items", "values"):
                if key in node:
                    self._collect(node[key])
            if isinstance(kind, (dict, list)):
                self._collect(kind)

    def _deref(self, avro: Any) -> Any:
        if isinstance(avro, str) and avro in self._named:
            return self._named[avro]
        if isinstance(avro, dict) and isinstance(avro.get("type"), (dict, list)):
            return self._deref(avro["type"])
        return avro

    def record(
        self, model: type[BaseModel], record: Mapping[str, Any], *, tagged: bool
    ) -> RecordPlan:
        name = record["name"]
        if record.get("type") != "record":
            raise SchemaMismatchError(f"{model.__name__} needs an Avro record, found {name}")
        tag = _tag_of(model) if tagged else None
        fields = {
            n: _annotation(f) for n, f in model.model_fields.items() if n != "type" or not tag
        }
        avro_fields = {f["name"]: f["type"] for f in record["fields"]}
        if set(fields) != set(avro_fields):
            missing = sorted(set(fields) - set(avro_fields))
            extra = sorted(set(avro_fields) - set(fields))
            raise SchemaMismatchError(
                f"Avro record {name} does not match {model.__name__}: fields missing from the "
                f"schema {missing}, fields the model lacks {extra}"
            )
        encoders: list[tuple[str, Convert]] = []
        decoders: list[tuple[str, Convert]] = []
        for field, annotation in fields.items():
            encode, decode = self._field(annotation, avro_fields[field], f"{name}.{field}")
            if encode is not None:
                encoders.append((field, encode))
            if decode is not None:
                decoders.append((field, decode))
        return RecordPlan(model, name, tag, tuple(encoders), tuple(decoders))

    def _field(
        self, annotation: Any, avro: Any, where: str
    ) -> tuple[Convert | None, Convert | None]:
        annotation = _unwrap(annotation)
        avro = self._deref(avro)
        args = _union_args(annotation)
        if args is not None and type(None) in args:
            rest = tuple(arg for arg in args if arg is not type(None))
            if not (isinstance(avro, list) and len(avro) == 2 and avro[0] == "null"):
                raise SchemaMismatchError(f"{where}: an optional field needs ['null', T]")
            inner = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007
            encode, decode = self._field(inner, avro[1], where)
            return (
                _optional(encode) if encode else None,
                _optional(decode) if decode else None,
            )
        if args is not None:
            return self._tagged_union(args, avro, where)
        if annotation is JsonValue:
            self._expect(avro == "bytes", where, "JSON values travel as bytes")
            return dump_json, load_json
        if annotation is datetime:
            self._expect(
                isinstance(avro, dict)
                and avro.get("type") == "long"
                and avro.get("logicalType") == "timestamp-micros",
                where,
                "datetimes travel as long timestamp-micros",
            )
            return _aware, None
        if annotation is SecretStr:
            self._expect(avro == "string", where, "a secret travels as a string")
            return _reveal, None
        if isclass(annotation) and issubclass(annotation, BaseModel):
            nested = self.record(annotation, self._expect_record(avro, where), tagged=False)
            return nested.to_datum, nested.from_datum
        if get_origin(annotation) is tuple:
            return self._tuple(annotation, avro, where)
        self._scalar(annotation, avro, where)
        return None, None

    def _tuple(
        self, annotation: Any, avro: Any, where: str
    ) -> tuple[Convert | None, Convert | None]:
        item, *rest = get_args(annotation)
        item = _unwrap(item)
        self._expect(
            rest == [Ellipsis] and isinstance(avro, dict) and avro.get("type") == "array",
            where,
            "a variable-length tuple travels as an array",
        )
        if isclass(item) and issubclass(item, BaseModel):
            nested = self.record(item, self._expect_record(avro["items"], where), tagged=False)
            return _each(nested.to_datum), _each(nested.from_datum)
        self._scalar(item, self._deref(avro["items"]), where)
        return None, None

    def _tagged_union(
        self, members: tuple[Any, ...], avro: Any, where: str
    ) -> tuple[Convert, Convert]:
        self._expect(isinstance(avro, list), where, "a union of models needs an Avro union")
        branches = {self._deref(branch)["name"]: self._deref(branch) for branch in avro}
        by_short = {name.rsplit(".", 1)[-1]: name for name in branches}
        names: dict[type[BaseModel], str] = {}
        plans: dict[str, RecordPlan] = {}
        for member in members:
            if not (isclass(member) and issubclass(member, BaseModel)):
                raise SchemaMismatchError(f"{where}: union member {member!r} is not a model")
            branch = by_short.get(member.__name__)
            if branch is None:
                raise SchemaMismatchError(f"{where}: no union branch for {member.__name__}")
            names[member] = branch
            plans[branch] = self.record(member, branches[branch], tagged=True)
        unmapped = sorted(set(branches) - set(plans))
        if unmapped:
            raise SchemaMismatchError(f"{where}: union branches without a model: {unmapped}")

        def encode(value: BaseModel) -> tuple[str, dict[str, Any]]:
            branch = names[type(value)]
            return branch, plans[branch].to_datum(value)

        def decode(value: tuple[str, dict[str, Any]]) -> dict[str, Any]:
            branch, datum = value
            return plans[branch].from_datum(datum)

        return encode, decode

    def _expect_record(self, avro: Any, where: str) -> Mapping[str, Any]:
        record = self._deref(avro)
        self._expect(
            isinstance(record, dict) and record.get("type") == "record", where, "needs a record"
        )
        result: Mapping[str, Any] = record
        return result

    def _scalar(self, annotation: Any, avro: Any, where: str) -> None:
        expected = {str: "string", int: "long", bool: "boolean", bytes: "bytes"}
        if annotation in expected:
            self._expect(avro == expected[annotation], where, f"needs {expected[annotation]}")
            return
        if get_origin(annotation) is Literal:
            values = {str(value) for value in get_args(annotation)}
        elif isclass(annotation) and issubclass(annotation, Enum):
            values = {str(member.value) for member in annotation}
        else:
            raise SchemaMismatchError(f"{where}: no Avro mapping for {annotation!r}")
        self._expect(
            isinstance(avro, dict)
            and avro.get("type") == "enum"
            and set(avro["symbols"]) == values,
            where,
            f"needs an enum with symbols {sorted(values)}",
        )

    @staticmethod
    def _expect(condition: bool, where: str, rule: str) -> None:
        if not condition:
            raise SchemaMismatchError(f"{where}: {rule}")
