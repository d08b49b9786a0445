"""The declared Kafka topics (``topology/topics.toml``) as frozen pydantic models.

A topic's name is ``<prefix>.<suffix>``; the prefix defaults to the file's ``prefix`` and can be
overridden per deployment or per test. Loading validates the rules the processor relies on:

1. suffixes are unique and every suffix in :data:`REQUIRED_SUFFIXES` is declared;
2. every run-keyed topic (``key = "run_id"``) has the same partition count (co-partitioning);
3. the events topic is keyed by run id and uses ``cleanup_policy = "delete"``: never compacted;
4. ``min_insync_replicas`` does not exceed ``replication_factor``.

The file is found at ``$FLOWSTREAM_TOPOLOGY``, else at ``topology/topics.toml`` of the source
tree this package runs from (a checkout, an editable install), else as the package's own copy
``flowstream/topics.toml`` (a built wheel carries one, see setup.py).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from flowstream.errors import FlowError

__all__ = [
    "CMD_CANCEL",
    "CMD_HOOK",
    "CMD_SIGNAL",
    "CMD_START",
    "CMD_TIMER",
    "DEADLETTER",
    "EVENTS",
    "REQUIRED_SUFFIXES",
    "TopicSpec",
    "Topology",
    "TopologyError",
    "default_topology_path",
    "load_topology",
]

EVENTS = "events"
CMD_START = "cmd.start"
CMD_SIGNAL = "cmd.signal"
CMD_HOOK = "cmd.hook"
CMD_CANCEL = "cmd.cancel"
CMD_TIMER = "cmd.timer"
DEADLETTER = "deadletter"
REQUIRED_SUFFIXES = (
    EVENTS,
    CMD_START,
    CMD_SIGNAL,
    CMD_HOOK,
    CMD_CANCEL,
    CMD_TIMER,
    DEADLETTER,
)

_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_TOPIC_NAME = 249


class TopologyError(FlowError):
    """The topology file is invalid, or the cluster's topics disagree with it."""


class TopicSpec(BaseModel):
    """One declared topic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    suffix: str = Field(pattern=r"^[a-z][a-z0-9.-]*$")
    key: Literal["run_id", "original_key"]
    partitions: int = Field(ge=1)
    replication_factor: int = Field(ge=1)
    min_insync_replicas: int = Field(ge=1)
    cleanup_policy: Literal["delete", "compact"]
    retention_ms: int = Field(ge=-1)
    retention_bytes: int = Field(ge=-1)
    #: Largest record the topic accepts; ``None`` keeps the broker's default (about 1 MB).
    max_message_bytes: int | None = Field(default=None, ge=1024)
    description: str = ""

    @property
    def run_keyed(self) -> bool:
        """Keyed by run id, hence co-partitioned with the events topic."""
        return self.key == "run_id"

    def name(self, prefix: str) -> str:
        """``<prefix>.<suffix>``."""
        name = f"{prefix}.{self.suffix}"
        if not _TOPIC_CHARS.match(prefix) or len(name) > _MAX_TOPIC_NAME:
            raise TopologyError(
                f"topic prefix {prefix!r} is not valid: use letters, digits, '.', '_' and '-' "
                f"and keep names within {_MAX_TOPIC_NAME} characters"
            )
        return name

    def configs(self, replication_factor: int | None = None) -> dict[str, str]:
        """Kafka topic configs; ``min.insync.replicas`` is capped by the replication used."""
        replicas = replication_factor or self.replication_factor
        return {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            **(
                {"max.message.bytes": str(self.max_message_bytes)}
                if self.max_message_bytes is not None
                else {}
            ),
            "min.insync.replicas": str(min(self.min_insync_replicas, replicas)),
        }

    @model_validator(mode="after")
    def _isr_within_replicas(self) -> TopicSpec:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"topic {self.suffix}: min_insync_replicas {self.min_insync_replicas} exceeds "
                f"replication_factor {self.replication_factor}"
            )
        return self


class Topology(BaseModel):
    """Every topic flowstream uses, and the default name prefix."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str = "flowstream"
    topics: tuple[TopicSpec, ...]

    @model_validator(mode="after")
    def _rules(self) -> Topology:
        suffixes = [t.suffix for t in self.topics]
        duplicates = sorted({s for s in suffixes if suffixes.count(s) > 1})
        if duplicates:
            raise ValueError(f"topics declared twice: {', '.join(duplicates)}")
        missing = [s for s in REQUIRED_SUFFIXES if s not in suffixes]
        if missing:
            raise ValueError(f"required topics not declared: {', '.join(missing)}")
        counts = {t.suffix: t.partitions for t in self.topics if t.run_keyed}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{s}={n}" for s, n in counts.items())
            raise ValueError(f"run-keyed topics must have one partition count, found {listed}")
        events = self.topic(EVENTS)
        if not events.run_keyed or events.cleanup_policy != "delete":
            raise ValueError("the events topic must be keyed by run_id with cleanup_policy delete")
        return self

    @property
    def run_partitions(self) -> int:
        """The partition count shared by every run-keyed topic (``partition_for``'s ``n``)."""
        return self.topic(EVENTS).partitions

    def topic(self, suffix: str) -> TopicSpec:
        """The declared topic with ``suffix``."""
        for spec in self.topics:
            if spec.suffix == suffix:
                return spec
        raise TopologyError(f"no topic {suffix!r} in the topology")

    def name(self, suffix: str, prefix: str | None = None) -> str:
        """The full name of topic ``suffix`` under ``prefix`` (default: the file's prefix)."""
        return self.topic(suffix).name(self.prefix if prefix is None else prefix)

    def names(self, prefix: str | None = None) -> dict[str, str]:
        """Suffix -> full topic name, for every declared topic."""
        return {spec.suffix: self.name(spec.suffix, prefix) for spec in self.topics}


def default_topology_path() -> Path:
    """``$FLOWSTREAM_TOPOLOGY``, else the source tree's ``topology/topics.toml``, else the copy
    an installed package carries."""
    configured = os.environ.get("FLOWSTREAM_TOPOLOGY")
    if configured:
        return Path(configured)
    package = Path(__file__).resolve().parent
    source = package.parent / "topology" / "topics.toml"
    shipped = package / "topics.toml"
    return shipped if shipped.is_file() and not source.is_file() else source


def load_topology(path: Path | None = None) -> Topology:
    """Read and validate a topology file (default: :func:`default_topology_path`)."""
    source = path or default_topology_path()
    try:
        with source.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise TopologyError(
            f"topology file {source} not found: set FLOWSTREAM_TOPOLOGY to topology/topics.toml"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"topology file {source} is not valid TOML: {exc}") from None
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}"
            for err in exc.errors()
        )
        raise TopologyError(f"topology file {source} is invalid: {problems}") from None
