"""The data model: spec, events, commands and snapshots (pydantic v2, frozen)."""
