"""Create the declared topics that are missing and verify the ones that exist.

``apply`` creates what is missing (waiting until every partition has a leader), then verifies
everything; ``verify`` only checks. Both take ``suffixes`` to handle some of the declared topics
only (a repartition creates the events topic before the command topics). A topic
that exists with another partition count or cleanup policy than declared is an error naming the
topic: run-keyed topics cannot be repartitioned in place, because
:func:`flowstream.partitioning.partition_for` would move runs to other partitions. A deployment
moves to another count under a new prefix instead (``flowstream kafka repartition``,
:mod:`flowstream.repartition`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from flowstream.kafka.clients import (
    AdminClient,
    ClusterMetadata,
    ConfigResource,
    KafkaError,
    KafkaException,
    NewTopic,
    ResourceType,
    new_admin,
)
from flowstream.topology import TopicSpec, Topology, TopologyError

__all__ = ["TopicState", "apply", "topic_configs", "verify"]


@dataclass(frozen=True)
class TopicState:
    """A declared topic as found (or just created) on the cluster."""

    suffix: str
    name: str
    partitions: int
    created: bool


def apply(
    admin: AdminClient | str,
    topology: Topology,
    *,
    prefix: str | None = None,
    replication_factor: int | None = None,
    timeout: float = 30.0,
    suffixes: Collection[str] | None = None,
) -> list[TopicState]:
    """Create missing topics (``replication_factor`` overrides the declared one), verify all
    (of ``suffixes``, when given)."""
    client = new_admin(admin) if isinstance(admin, str) else admin
    names = _names(topology, prefix, suffixes)
    metadata = client.list_topics(timeout=timeout)
    missing = [
        spec
        for spec in topology.topics
        if spec.suffix in names and names[spec.suffix] not in metadata.topics
    ]
    brokers = len(metadata.brokers)
    for spec in missing:
        replicas = replication_factor or spec.replication_factor
        if replicas > brokers:
            raise TopologyError(
                f"topic {names[spec.suffix]} needs replication factor {replicas} but the cluster "
                f"has {brokers} broker(s); pass a smaller replication factor "
                "(e.g. --replication-factor 1 for a one-broker development cluster)"
            )
    if missing:
        _create(client, [(names[s.suffix], s) for s in missing], replication_factor, timeout)
        # One metadata answer that shows every declared topic: brokers learn of new topics
        # at slightly different times, so a later request may reach one that has not yet.
        metadata = _wait_for_leaders(
            client, [names[s.suffix] for s in missing], list(names.values()), timeout
        )
    created = {names[spec.suffix] for spec in missing}
    return _check(client, metadata, topology, names, created, timeout)


def verify(
    admin: AdminClient | str,
    topology: Topology,
    *,
    prefix: str | None = None,
    timeout: float = 30.0,
    suffixes: Collection[str] | None = None,
) -> list[TopicState]:
    """Check that every declared topic (of ``suffixes``, when given) exists as declared; raise
    :class:`TopologyError` if not."""
    client = new_admin(admin) if isinstance(admin, str) else admin
    metadata = client.list_topics(timeout=timeout)
    names = _names(topology, prefix, suffixes)
    return _check(client, metadata, topology, names, set(), timeout)


def _names(
    topology: Topology, prefix: str | None, suffixes: Collection[str] | None = None
) -> dict[str, str]:
    names = topology.names(prefix)
    if suffixes is None:
        return names
    unknown = sorted(set(suffixes) - names.keys())
    if unknown:
        raise TopologyError(f"no topic {', '.join(map(repr, unknown))} in the topology")
    return {suffix: name for suffix, name in names.items() if suffix in suffixes}


def _create(
    client: AdminClient,
    specs: Sequence[tuple[str, TopicSpec]],
    replication_factor: int | None,
    timeout: float,
) -> None:
    new_topics = []
    for name, spec in specs:
        replicas = replication_factor or spec.replication_factor
        new_topics.append(
            NewTopic(
                name,
                num_partitions=spec.partitions,
                replication_factor=replicas,
                config=spec.configs(replicas),
            )
        )
    futures = client.create_topics(new_topics, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            # Another process created it meanwhile; the check below still verifies it.
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise TopologyError(f"could not create topic {name}: {exc}") from None


def _wait_for_leaders(
    client: AdminClient, created: Sequence[str], names: Sequence[str], timeout: float
) -> ClusterMetadata:
    """The first metadata answer that lists ``names`` and has every leader of ``created``."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = client.list_topics(timeout=timeout)
        pending = [name for name in created if not _has_leaders(metadata, name)]
        pending += [name for name in names if name not in metadata.topics]
        if not pending:
            return metadata
        if time.monotonic() >= deadline:
            raise TopologyError(
                f"topics without a leader for every partition after {timeout:.0f} s: "
                f"{', '.join(pending)}"
            )
        time.sleep(0.1)


def _has_leaders(metadata: ClusterMetadata, name: str) -> bool:
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None or not topic.partitions:
        return False
    return all(p.leader >= 0 and p.error is None for p in topic.partitions.values())


def _check(
    client: AdminClient,
    metadata: ClusterMetadata,
    topology: Topology,
    names: dict[str, str],
    created: set[str],
    timeout: float,
) -> list[TopicState]:
    problems: list[str] = []
    states: list[TopicState] = []
    present: list[tuple[str, TopicSpec]] = []
    missing: list[str] = []
    for spec in topology.topics:
        if spec.suffix not in names:
            continue
        name = names[spec.suffix]
        topic = metadata.topics.get(name)
        if topic is None:
            missing.append(name)
            continue
        count = len(topic.partitions)
        if count != spec.partitions:
            problems.append(
                f"topic {name} has {count} partitions but the topology declares "
                f"{spec.partitions}; partition counts cannot change in place (move the "
                "deployment to a new prefix with `flowstream kafka repartition`)"
            )
        present.append((name, spec))
        states.append(TopicState(spec.suffix, name, count, name in created))
    if missing:
        problems.insert(
            0, f"topics missing: {', '.join(missing)} (create them with `flowstream topics apply`)"
        )
    problems += _check_cleanup(client, present, timeout)
    if problems:
        raise TopologyError("; ".join(problems))
    return states


def _check_cleanup(
    client: AdminClient, present: Sequence[tuple[str, TopicSpec]], timeout: float
) -> list[str]:
    if not present:
        return []
    configs = topic_configs(client, [name for name, _ in present], timeout=timeout)
    problems = []
    for name, spec in present:
        policy = configs[name].get("cleanup.policy")
        if policy != spec.cleanup_policy:
            problems.append(
                f"topic {name} has cleanup.policy={policy} but the topology declares "
                f"{spec.cleanup_policy}"
            )
    return problems


def topic_configs(
    admin: AdminClient | str, names: Sequence[str], *, timeout: float = 30.0
) -> dict[str, dict[str, str | None]]:
    """Each topic's effective configuration (name -> value).

    A topic created a moment ago may be unknown to the broker that answers until metadata
    reaches it, so ``UNKNOWN_TOPIC_OR_PART`` is retried until ``timeout``.
    """
    client = new_admin(admin) if isinstance(admin, str) else admin
    deadline = time.monotonic() + timeout
    found: dict[str, dict[str, str | None]] = {}
    pending = list(names)
    while pending:
        resources = {name: ConfigResource(ResourceType.TOPIC, name) for name in pending}
        futures = client.describe_configs(list(resources.values()), request_timeout=timeout)
        retry = []
        for name, resource in resources.items():
            try:
                entries = futures[resource].result()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                unknown = (
                    isinstance(error, KafkaError)
                    and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                )
                if unknown and time.monotonic() < deadline:
                    retry.append(name)
                    continue
                raise TopologyError(
                    f"could not read the configuration of topic {name}: {exc}"
                ) from None
            found[name] = {key: entry.value for key, entry in entries.items()}
        pending = retry
        if pending:
            time.sleep(0.2)
    return found
