"""A consumer group is described in a child process, because librdkafka aborts the whole
process when the group coordinator's connection drops while an admin client describes the group
(``rdkafka_queue.h: rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0'
failed``; librdkafka issues 4605 and 3663).

Before, a starting worker polled ``describe_consumer_groups`` in its own process to refuse an
instance id in use. The short chaos run of CI restarted a worker while a broker was being killed,
and that worker ended with the assertion. Four threads describing a group in one process while
its coordinator was SIGKILLed aborted the process in the first round of a probe (exit 134)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from flowstream.devkafka import Cluster
from flowstream.errors import InstanceInUseError
from flowstream.kafka import clients
from flowstream.processor.connect import client_id, refuse_instance_in_use
from flowstream.settings import Settings
from tests.processor.harness import three_brokers_topic, wait_until

#: Describes the group from four threads until told to stop (a line on its standard input),
#: as a worker's start would, and prints what it saw.
_DESCRIBER = textwrap.dedent(
    """
    import json, sys, threading
    from flowstream.kafka import clients

    bootstrap, group = sys.argv[1], sys.argv[2]
    seen = {"described": 0, "crashed": 0, "failed": 0}
    done = threading.Event()

    def describe():
        while not done.is_set():
            try:
                clients.describe_group(bootstrap, group, timeout=3)
                seen["described"] += 1
            except clients.KafkaException as exc:
                code = exc.args[0].code()
                seen["crashed" if code == clients.KafkaError._TRANSPORT else "failed"] += 1

    threads = [threading.Thread(target=describe) for _ in range(4)]
    for thread in threads:
        thread.start()
    sys.stdin.readline()
    done.set()
    for thread in threads:
        thread.join()
    print(json.dumps(seen))
    """
)


@pytest.mark.kafka3
@pytest.mark.timeout(300)
def test_describing_a_group_survives_its_coordinators_sigkill(
    kafka3_cluster: Cluster, unique_prefix: str
) -> None:
    bootstrap = kafka3_cluster.bootstrap
    topic, group = f"{unique_prefix}.commands", f"{unique_prefix}-group"
    three_brokers_topic(bootstrap, topic, 4)
    member = clients.new_consumer(bootstrap, group)
    member.subscribe([topic])
    wait_until(lambda: member.poll(0.2) is None and bool(member.assignment()), 60, "no assignment")
    describer = subprocess.Popen(
        [sys.executable, "-c", _DESCRIBER, bootstrap, group],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(2):
            coordinator = _coordinator(bootstrap, group)
            kafka3_cluster.kill_node(coordinator)
            ends = time.monotonic() + 8
            while time.monotonic() < ends:
                member.poll(0.2)
            kafka3_cluster.start_node(coordinator)
            ends = time.monotonic() + 4
            while time.monotonic() < ends:
                member.poll(0.2)
        out, err = describer.communicate("stop\n", timeout=60)
    finally:
        if describer.poll() is None:
            describer.kill()
        member.close()
    assert describer.returncode == 0, err[-3000:]
    seen = json.loads(out)
    # The group was described throughout, the kills notwithstanding; a child that librdkafka
    # aborted counts as "crashed" and its caller went on.
    assert seen["described"] > 0, seen
    print(f"described {seen}")


def _coordinator(bootstrap: str, group: str) -> int:
    """The group's coordinator, once a description succeeds (one that follows a restart may
    meet NOT_COORDINATOR)."""
    found: list[int] = []

    def ask() -> bool:
        try:
            found.append(clients.GroupQuery(bootstrap, group).result().coordinator)
        except clients.KafkaException:
            return False
        return found[-1] >= 0

    wait_until(ask, 60, f"group {group} could not be described")
    return found[-1]


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_a_describing_child_ended_by_a_signal_is_asked_again(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """The first description dies of SIGABRT; the instance id is still checked, and refused."""
    settings = Settings(
        bootstrap=kafka_bootstrap, group=f"{unique_prefix}-group", instance_id="taken"
    )
    topic = f"{unique_prefix}.commands"
    admin = clients.new_admin(kafka_bootstrap)
    admin.create_topics([clients.NewTopic(topic, 2, 1)])[topic].result(30)
    holder = clients.new_consumer(
        kafka_bootstrap, settings.group, {"client.id": client_id(settings)}
    )
    holder.subscribe([topic])
    wait_until(lambda: holder.poll(0.2) is None and bool(holder.assignment()), 60, "no assignment")
    try:
        first = clients.GroupQuery(kafka_bootstrap, settings.group)
        os.kill(first._child.pid, signal.SIGABRT)
        with pytest.raises(clients.KafkaException) as crashed:
            first.result()
        error = crashed.value.args[0]
        assert error.code() == clients.KafkaError._TRANSPORT and error.retriable(), error
        assert "SIGABRT" in error.str(), error.str()

        first = clients.GroupQuery(kafka_bootstrap, settings.group)
        os.kill(first._child.pid, signal.SIGABRT)
        with pytest.raises(InstanceInUseError, match="'taken' is in use"):
            refuse_instance_in_use(settings, 1000, first)
    finally:
        holder.close()
