"""Hook tokens on the real broker: claimed once cluster-wide, and never at rest in clear.

* Two runs on different partitions claim one token: the second records
  ``HookTokenConflictError`` (its hook creation undone), a resume by the token reaches the
  first, and once the first's hook is resumed, or its run ends, the next claim succeeds.
* Runs with hooks are resumed by their tokens early (before the run or hook exists), on time,
  late (after the hook was resumed) and wrongly; then every record of every topic (read
  uncommitted, every partition), every file of every state directory (and every key and
  value of every RocksDB in them) and the worker's log are searched for each token's bytes.
  The only records that may hold a token are the ones this test itself produced to
  ``cmd.hook``: a token must reach the processor once, so a client's resume carries it.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from rocksdict import AccessType, Options, Rdict

from flowstream import codec, wire
from flowstream.errors import FlowError
from flowstream.kafka import clients
from flowstream.model.messages import ResumeHook
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.topology import CMD_HOOK, EVENTS, load_topology
from tests.processor.apps import SPEC
from tests.processor.harness import Cluster, free_port, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

#: Quick task retries, so a claim that lost is tried again soon after the token is free.
RETRIES = {
    "FLOWSTREAM_TASK_RETRY_INITIAL_MS": "200",
    "FLOWSTREAM_TASK_RETRY_MAX_INTERVAL_MS": "2000",
    "FLOWSTREAM_TASK_RETRY_MAX_AUTOMATIC": "1000",
}


def _token(name: str) -> str:
    return f"{name}-{secrets.token_hex(16)}"


def _history_types(cluster: Cluster, run_id: str) -> list[str]:
    try:
        return [e.event.type for e in cluster.client.history(run_id, timeout=5)]
    except FlowError:
        return []


def _conflicts(cluster: Cluster, run_id: str) -> list[Any]:
    try:
        history = cluster.client.history(run_id, timeout=5)
    except FlowError:
        return []
    return [
        e.event
        for e in history
        if e.event.type == "workflow_task_failed" and e.event.error_type == "HookTokenConflictError"  # type: ignore[union-attr]
    ]


def _records(cluster: Cluster, topic: str) -> list[Any]:
    """Every record of ``topic``, all partitions, read uncommitted (aborted ones included)."""
    reader = clients.new_consumer(
        cluster.bootstrap,
        f"{cluster.prefix}-scan-{secrets.token_hex(3)}",
        {"isolation.level": "read_uncommitted", "enable.partition.eof": True},
    )
    try:
        metadata = reader.list_topics(topic, timeout=10).topics[topic]
        partitions = sorted(metadata.partitions)
        ends = {
            p: reader.get_watermark_offsets(
                clients.TopicPartition(topic, p), timeout=10, cached=False
            )[1]
            for p in partitions
        }
        pending = {p for p, end in ends.items() if end > 0}
        reader.assign([clients.TopicPartition(topic, p, 0) for p in pending])
        found: list[Any] = []
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for message in reader.consume(500, 0.5):
                if message.error() is None:
                    found.append(message)
                    if message.offset() + 1 >= ends[message.partition()]:
                        pending.discard(message.partition())
                elif message.error().code() == clients.KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
        assert not pending, f"{topic}: partitions {pending} not read to their end"
        return found
    finally:
        reader.close()


def _holds(message: Any, needle: bytes) -> bool:
    parts = [message.key() or b"", message.value() or b""]
    parts += [value or b"" for _, value in message.headers() or ()]
    return any(needle in bytes(part) for part in parts)


def _rocksdb_entries(directory: Path) -> list[bytes]:
    """Every key and value of the RocksDB at ``directory``, read through RocksDB itself (its
    files may hold blocks compressed)."""
    options = Options(raw_mode=True)
    db = Rdict(str(directory), options=options, access_type=AccessType.read_only())
    try:
        return [bytes(part) for key, value in db.items() for part in (key, value)]
    finally:
        db.close()


def _resume(cluster: Cluster, run_id: str, hook_id: str, token: str, payload: Any) -> None:
    """A client's resume by run and hook id that also presents the token."""
    command = ResumeHook(run_id=run_id, hook_id=hook_id, token=SecretStr(token), payload=payload)
    producer = clients.new_producer(cluster.bootstrap)
    producer.produce(
        f"{cluster.prefix}.{CMD_HOOK}",
        value=codec.encode_message(command),
        key=run_id.encode(),
        partition=partition_for(run_id, cluster.client.partitions),
    )
    assert producer.flush(30) == 0


def _claimed(cluster: Cluster, token: str, run_id: str) -> bool:
    """The digest's partition recorded ``run_id``'s claim of ``token`` as the active one (its
    ``hook-claim`` records, read by their header)."""
    digest = token_digest(token)
    claim = wire.hook_token_value(digest, run_id, "approval")
    active = False
    for message in _records(cluster, f"{cluster.prefix}.{EVENTS}"):
        if message.key() != digest.encode():
            continue
        kind = wire.header_of(message, wire.RECORD_HEADER)
        if kind == b"hook-claim":
            active = message.value() == claim
        elif kind == b"hook-release" and message.value() == claim:
            active = False
    return active


def _hook_open(cluster: Cluster, run_id: str) -> bool:
    """``run_id``'s hook is created and active. Its claim went to the digest's ``cmd.hook``
    partition in the same transaction, so a resume by the token sent now is read after it."""
    try:
        hook = cluster.client.snapshot(run_id, timeout=5).hooks.get("approval")
    except FlowError:
        return False
    return hook is not None and hook.status.value == "active"


def _two_partitions(cluster: Cluster, name: str, count: int) -> list[str]:
    """``count`` run ids on distinct partitions."""
    runs: dict[int, str] = {}
    index = 0
    while len(runs) < count:
        run_id = f"{name}-{index}"
        runs.setdefault(partition_for(run_id, cluster.client.partitions), run_id)
        index += 1
    return list(runs.values())


def test_a_token_is_claimed_once_across_partitions_and_free_again_once_released(
    cluster: Cluster,
) -> None:
    worker = cluster.start("w1", extra_env=RETRIES)
    client = cluster.client
    token = _token("shared")
    first, second, third = _two_partitions(cluster, "claim", 3)
    hooked = {"hook_digest": token_digest(token)}

    client.start(first, SPEC, hooked)
    client.flush()
    wait_until(lambda: _hook_open(cluster, first), 60, "the first hook is not created")
    client.start(second, SPEC, hooked)
    client.flush()
    wait_until(lambda: _conflicts(cluster, second), 60, f"no conflict: {worker.output()[-2000:]}")
    conflict = _conflicts(cluster, second)[0]
    assert conflict.undone_hook == "approval"
    assert f"hook approval of run {first}" in conflict.message
    assert token not in conflict.message and token_digest(token) not in conflict.message

    # The token reaches the first claim, never the second, however often the second retries.
    client.resume_hook_by_token(token, {"by": "token", "for": "first"})
    client.flush()
    done = client.wait(first, timeout=60)
    assert done.status.value == "completed", worker.output()[-3000:]
    assert done.output["approval"] == {"by": "token", "for": "first"}  # type: ignore[index]

    # Resumed: the token is released, and the second's next claim wins.
    wait_until(lambda: _claimed(cluster, token, second), 60, "the second never claimed again")
    client.start(third, SPEC, hooked)  # the second holds it now: the third waits
    client.flush()
    wait_until(lambda: _conflicts(cluster, third), 60, "the third claim was not refused")
    client.resume_hook_by_token(token, {"by": "token", "for": "second"})
    client.flush()
    try:
        done = client.wait(second, timeout=60)
    except TimeoutError as exc:
        raise AssertionError(
            f"{_history_types(cluster, second)}\n{worker.output()[-4000:]}"
        ) from exc
    assert done.status.value == "completed", worker.output()[-3000:]
    assert done.output["approval"] == {"by": "token", "for": "second"}  # type: ignore[index]
    history = _history_types(cluster, second)
    # Created, undone by each lost claim, created again: the last creation won.
    assert history.count("hook_created") == 1 + len(_conflicts(cluster, second)) > 1, history

    # The third holds it now; its run ends (force-cancelled) and releases the token again.
    wait_until(lambda: _claimed(cluster, token, third), 60, "the third never claimed again")
    client.cancel(third, "not needed", force=True)
    client.flush()
    assert client.wait(third, timeout=60).status.value == "cancelled"
    wait_until(lambda: not _claimed(cluster, token, third), 60, "a cancelled run kept its token")
    fourth = "claim-after-end"
    client.start(fourth, SPEC, hooked)
    client.flush()
    wait_until(lambda: _claimed(cluster, token, fourth), 60, "no claim after the run ended")
    assert not _conflicts(cluster, fourth)
    client.resume_hook_by_token(token, {"for": "fourth"})
    client.flush()
    assert client.wait(fourth, timeout=60).output["approval"] == {"for": "fourth"}  # type: ignore[index]
    assert token not in worker.output()


def test_a_conflict_on_one_partition_is_recorded_the_same_way(cluster: Cluster) -> None:
    """Two runs of one partition: the second's claim loses on the digest's partition too,
    and the run records it (no dead-lettered start, no stalled run)."""
    worker = cluster.start("w1", extra_env=RETRIES)
    client = cluster.client
    token = _token("local")
    first = "local-0"
    partition = partition_for(first, client.partitions)
    second = next(
        f"local-{i}"
        for i in range(1, 500)
        if partition_for(f"local-{i}", client.partitions) == partition
    )
    client.start(first, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    wait_until(lambda: _hook_open(cluster, first), 60, "the first hook is not created")
    client.start(second, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    wait_until(lambda: _conflicts(cluster, second), 60, f"no conflict: {worker.output()[-2000:]}")
    client.resume_hook_by_token(token, {"for": "first"})
    client.flush()
    assert client.wait(first, timeout=60).output["approval"] == {"for": "first"}  # type: ignore[index]


def test_no_hook_token_is_at_rest_after_early_late_and_wrong_resumes(
    cluster: Cluster,
) -> None:
    port = free_port()
    worker = cluster.start("w1", extra_env={**RETRIES, "FLOWSTREAM_METRICS_PORT": str(port)})
    client = cluster.client
    by_token, parked, checked = _token("by-token"), _token("parked"), _token("checked")
    wrong = _token("wrong")
    sent: dict[str, int] = {by_token: 0, parked: 0, checked: 0, wrong: 0}

    def by_token_only(token: str, payload: Any) -> None:
        client.resume_hook_by_token(token, payload)
        client.flush()
        sent[token] += 1

    def by_address(run_id: str, token: str, payload: Any) -> None:
        _resume(cluster, run_id, "approval", token, payload)
        sent[token] += 1

    # Early: before any run exists. By the token alone (no hook has claimed it: refused), and by
    # run and hook id with the token (the run does not exist yet: parked).
    by_token_only(by_token, {"early": True})
    by_address("rest-parked", parked, {"by": "parked"})
    for run_id, token in (
        ("rest-token", by_token),
        ("rest-parked", parked),
        ("rest-checked", checked),
    ):
        client.start(run_id, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    assert client.wait("rest-parked", timeout=60).output["approval"] == {"by": "parked"}  # type: ignore[index]

    # On time, and wrong: a token nothing claimed, a wrong token for a named hook, the right one.
    wait_until(lambda: _hook_open(cluster, "rest-token"), 60, "no hook")
    by_token_only(by_token, {"by": "token"})
    by_token_only(wrong, {"by": "mallory"})
    wait_until(lambda: _hook_open(cluster, "rest-checked"), 60, "no hook")
    by_address("rest-checked", wrong, {"by": "mallory"})
    by_address("rest-checked", checked, {"by": "checked"})
    results = client.wait_all(["rest-token", "rest-checked"], timeout=60)
    assert results["rest-token"].output["approval"] == {"by": "token"}  # type: ignore[index]
    assert results["rest-checked"].output["approval"] == {"by": "checked"}  # type: ignore[index]

    # Late: after the hooks were resumed (the tokens are released), other payloads.
    by_token_only(by_token, {"late": True})
    by_address("rest-parked", parked, {"late": True})
    letters_topic = f"{cluster.prefix}.deadletter"

    def hook_letters() -> list[Any]:
        letters = [codec.decode_dead_letter(m.value()) for m in _records(cluster, letters_topic)]
        return [d for d in letters if d.source_topic.endswith(CMD_HOOK)]

    # Five refused: early by token, the never-claimed token, the wrong one, and both late ones.
    wait_until(lambda: len(hook_letters()) >= 5, 60, f"dead letters: {worker.output()[-2000:]}")
    page = [line for line in _metrics_page(port).splitlines() if not line.startswith("#")]
    assert page, "the metrics page is empty"
    assert worker.stop() == 0, worker.output()[-3000:]

    records = {name: _records(cluster, topic) for name, topic in _topics(cluster).items()}
    assert set(load_topology().names()) <= set(records)
    inbox = [m for m in records[EVENTS] if wire.kind_of(m) is wire.RecordKind.INBOX]
    assert inbox, "the early resume by run and hook id was not parked"
    state = cluster.root / "state"
    databases = [path.parent for path in state.rglob("CURRENT")]
    assert databases, f"no RocksDB under {state}"
    entries = [entry for db in databases for entry in _rocksdb_entries(db)]
    files = [path.read_bytes() for path in state.rglob("*") if path.is_file()]
    text = "\n".join(page) + worker.output()
    for token, count in sent.items():
        needle = token.encode()
        holding = [(name, m) for name, found in records.items() for m in found if _holds(m, needle)]
        # Only the client's own resumes on cmd.hook, each once: nothing a processor wrote.
        assert {name for name, _ in holding} <= {CMD_HOOK}, [
            (name, m.partition(), m.offset()) for name, m in holding
        ]
        assert len(holding) == count, (token[:8], len(holding), count)
        for _, message in holding:
            command = codec.decode_command(message.value())
            assert isinstance(command, ResumeHook) and command.token is not None
            assert command.token.get_secret_value() == token
        assert not any(needle in entry for entry in entries), f"{token[:8]} in RocksDB"
        assert not any(needle in data for data in files), f"{token[:8]} in a state file"
        assert token not in text, f"{token[:8]} in the log or the metrics"
    # The parked resume kept the digest in the token's place.
    assert any(token_digest(parked).encode() in (m.value() or b"") for m in inbox)


def _topics(cluster: Cluster) -> dict[str, str]:
    """Every topic of the cluster under the test's prefix, by suffix."""
    admin = clients.new_admin(cluster.bootstrap)
    names = admin.list_topics(timeout=10).topics
    start = cluster.prefix + "."
    return {name.removeprefix(start): name for name in names if name.startswith(start)}


def _metrics_page(port: int) -> str:
    import urllib.request

    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def _assigned(worker: Any) -> set[int] | None:
    """The partitions ``worker`` owns by its log's last change of them (``None`` before one):
    with the consumer protocol an assignment names only the partitions it adds."""
    lines = [line for line in worker.output().splitlines() if " partitions [" in line]
    if not lines:
        return None
    inside = lines[-1].rsplit("; owns [", 1)[1].rstrip("]")
    return {int(p) for p in inside.split(",") if p.strip()}


def test_a_claim_outlives_the_crash_of_its_digest_partition_before_the_answer(
    cluster: Cluster,
) -> None:
    """The second claim is sent (with its ``hook_created``) while the owner of the token's
    partition is frozen; the heir restores the claims from the events topic, applies the
    claim once and answers it: the second run records the conflict, the first keeps the
    token."""
    env = {**RETRIES, "FLOWSTREAM_SESSION_TIMEOUT_MS": "3000"}
    frozen, heir = cluster.start("frozen", env), cluster.start("heir", env)
    partitions = set(range(cluster.client.partitions))

    def split() -> bool:
        mine, theirs = _assigned(frozen), _assigned(heir)
        return bool(mine) and bool(theirs) and (mine or set()) | (theirs or set()) == partitions

    wait_until(split, 60, f"the two workers never split the partitions: {cluster.logs()}")
    held, kept = _assigned(frozen) or set(), _assigned(heir) or set()
    token = next(
        t
        for t in (_token("crash") for _ in range(1000))
        if partition_for(token_digest(t), cluster.client.partitions) in held
    )
    first, second = (
        next(
            f"{name}-{i}"
            for i in range(1000)
            if partition_for(f"{name}-{i}", cluster.client.partitions) in kept
        )
        for name in ("crash-first", "crash-second")
    )
    client = cluster.client
    client.start(first, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    wait_until(lambda: _hook_open(cluster, first), 60, "the first hook is not created")

    frozen.signal(signal.SIGSTOP)  # owns the token's partition, and answers nothing now
    client.start(second, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    wait_until(lambda: _hook_open(cluster, second), 30, f"no hook: {heir.output()[-2000:]}")
    assert not _conflicts(cluster, second)  # its claim waits on cmd.hook, unanswered
    wait_until(lambda: _assigned(heir) == partitions, 60, f"no takeover: {heir.output()[-2000:]}")
    frozen.kill()
    wait_until(lambda: _conflicts(cluster, second), 60, f"no answer: {heir.output()[-3000:]}")
    assert _claimed(cluster, token, first) and not _claimed(cluster, token, second)
    client.resume_hook_by_token(token, {"for": "first"})
    client.flush()
    assert client.wait(first, timeout=60).output["approval"] == {"for": "first"}  # type: ignore[index]
    wait_until(lambda: _claimed(cluster, token, second), 60, "the second never claimed again")
    client.resume_hook_by_token(token, {"for": "second"})
    client.flush()
    assert client.wait(second, timeout=60).output["approval"] == {"for": "second"}  # type: ignore[index]


def test_a_disposed_hook_releases_its_token(cluster: Cluster) -> None:
    cluster.start("w1", extra_env=RETRIES)
    client = cluster.client
    token = _token("disposed")
    first, second = _two_partitions(cluster, "dispose", 2)
    client.start(first, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    wait_until(lambda: _hook_open(cluster, first), 60, "the first hook is not created")
    client.start(second, SPEC, {"hook_digest": token_digest(token)})
    client.flush()
    wait_until(lambda: _conflicts(cluster, second), 60, "the second claim was not refused")
    client.dispose_hook(first, "approval")
    client.flush()
    wait_until(lambda: _claimed(cluster, token, second), 60, "the disposed hook kept its token")
    client.resume_hook_by_token(token, {"for": "second"})
    client.flush()
    assert client.wait(second, timeout=60).output["approval"] == {"for": "second"}  # type: ignore[index]
