"""Avro schema documents: the ``.avsc`` files shipped in ``flowstream/schemas``, one per named
record, and the self-contained schema of a record, with every reference to another record
inlined at its first use (as ``fastavro.schema.load_schema`` does). Pure Python: the codec
(:mod:`flowstream.codec`) parses what this returns."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from flowstream.errors import SerializationError

__all__ = ["default_directory", "documents", "fullname", "resolve_schema"]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})


def resolve_schema(name: str, library: Mapping[str, Any]) -> dict[str, Any]:
    """The self-contained schema of ``name``: references inlined at first use, full names.

    ``library`` maps full names to parsed ``.avsc`` documents.
    """
    if name not in library:
        raise SerializationError(f"no Avro schema named {name}")
    resolved: dict[str, Any] = _resolve(library[name], "", library, set())
    return resolved


def fullname(node: Mapping[str, Any], namespace: str) -> tuple[str, str]:
    """The full name of a named type's document and the namespace its references resolve in."""
    name: str = node["name"]
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    space: str = node.get("namespace", namespace) or ""
    return (f"{space}.{name}" if space else name), space


def _resolve(node: Any, namespace: str, library: Mapping[str, Any], defined: set[str]) -> Any:
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return node
        full = node if "." in node or not namespace else f"{namespace}.{node}"
        if full in defined:
            return full
        if full not in library:
            raise SerializationError(f"Avro type {full} is not defined: add {full}.avsc")
        return _resolve(library[full], "", library, defined)
    if isinstance(node, list):
        return [_resolve(item, namespace, library, defined) for item in node]
    kind = node["type"]
    if not isinstance(kind, str) or kind not in _NAMED | {"array", "map"} | _PRIMITIVES:
        return _resolve(kind, namespace, library, defined)
    if kind in _NAMED:
        full, space = fullname(node, namespace)
        if full in defined:
            raise SerializationError(f"Avro type {full} is defined twice")
        defined.add(full)
        out: dict[str, Any] = {"type": kind, "name": full}
        out.update((k, v) for k, v in node.items() if k not in ("type", "name", "namespace"))
        if kind in ("record", "error"):
            out["fields"] = [
                {**field, "type": _resolve(field["type"], space, library, defined)}
                for field in node["fields"]
            ]
        return out
    if kind == "array":
        return {**node, "items": _resolve(node["items"], namespace, library, defined)}
    if kind == "map":
        return {**node, "values": _resolve(node["values"], namespace, library, defined)}
    return node


def documents(directory: Traversable) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each ``.avsc`` file of ``directory``, by file name, parsed."""
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if entry.is_file() and entry.name.endswith(".avsc"):
            try:
                document = json.loads(entry.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise SerializationError(f"schema file {entry.name} is not JSON: {exc}") from exc
            yield entry.name, document


def default_directory() -> Traversable:
    """The schemas shipped with the package."""
    return resources.files("flowstream").joinpath("schemas")
