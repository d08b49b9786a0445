"""Apache Kafka's jars, fetched once from Maven Central into a per-version cache.

The cache is ``<cache root>/kafka-<version>/`` (default root ``$XDG_CACHE_HOME/flowstream`` or
``~/.cache/flowstream``). With Maven on ``PATH`` it holds a small ``pom.xml`` naming
``org.apache.kafka:kafka_2.13`` and the logging pieces its POM leaves out (the SLF4J 1.x binding
for log4j2), and ``libs/`` with the runtime closure that
``maven-dependency-plugin:copy-dependencies`` copies there; Maven keeps its own download cache in
``~/.m2``. Without Maven, the pinned version's jars are those ``jars.lock`` records, fetched one
by one (``central``). Either way every jar of ``libs/`` is checked against the lock's SHA-256
each time the jars are handed out, so a damaged cache is refused rather than run. Nothing is
fetched from anywhere but Maven Central (or the mirror ``FLOWSTREAM_MAVEN_REPOSITORY`` names).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from flowstream.devkafka.central import check_libs, fetch_locked, locked_jars
from flowstream.devkafka.errors import DevKafkaError

__all__ = ["KAFKA_VERSION", "LOG4J_VERSION", "default_cache_root", "ensure_jars", "find_mvn"]

KAFKA_VERSION = "4.4.0"
#: The log4j2 release Kafka 4.4.0 itself depends on; api, core and the binding must match.
LOG4J_VERSION = "2.25.5"
#: Kafka 4.x logs through SLF4J 1.7; ``log4j-slf4j-impl`` is the binding SLF4J 1.7 discovers.
SLF4J_VERSION = "1.7.36"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_FETCH_TIMEOUT_S = 1200

_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.flowstream</groupId>
  <artifactId>kafka-broker-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

_DEPENDENCY = """\
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>"""


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/flowstream``, else ``~/.cache/flowstream``."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "flowstream"


def find_mvn() -> str:
    """The ``mvn`` executable on ``PATH``."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevKafkaError(
            "mvn not found on PATH: install Apache Maven (it fetches the Kafka jars from "
            f"Maven Central once), or use Kafka {KAFKA_VERSION}, whose jars are fetched "
            "without it"
        )
    return mvn


def _pom(version: str) -> str:
    coordinates = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ]
    dependencies = "\n".join(
        _DEPENDENCY.format(group=g, artifact=a, version=v) for g, a, v in coordinates
    )
    return _POM.format(dependencies=dependencies)


def ensure_jars(cache_root: Path | None = None, *, version: str = KAFKA_VERSION) -> Path:
    """The ``libs`` directory of Kafka ``version``, fetched with Maven if it is not cached yet."""
    root = cache_root or default_cache_root()
    cache = root / f"kafka-{version}"
    libs = cache / "libs"
    jars = locked_jars(version)
    if not _complete(libs, version):
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".fetch.lock").open("w") as lock:
            # Two launchers fetching at once would race on the rename below.
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _complete(libs, version):
                if jars is not None and shutil.which("mvn") is None:
                    fetch_locked(root, libs, jars)
                else:
                    _fetch(cache, libs, version)
    if jars is not None:
        check_libs(libs, jars)
    return libs


def _complete(libs: Path, version: str) -> bool:
    return (libs / f"kafka_2.13-{version}.jar").is_file() and (libs / ".complete").is_file()


def _fetch(cache: Path, libs: Path, version: str) -> None:
    mvn = find_mvn()
    pom = cache / "pom.xml"
    pom.write_text(_pom(version), encoding="utf-8")
    staging = cache / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    log = cache / "mvn.log"
    command = [
        mvn,
        "-B",
        "-f",
        str(pom),
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    with log.open("wb") as out:
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=_FETCH_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DevKafkaError(
                f"mvn did not fetch Kafka {version} within {_FETCH_TIMEOUT_S} s; see {log}"
            ) from None
    if result.returncode != 0 or not (staging / f"kafka_2.13-{version}.jar").is_file():
        raise DevKafkaError(
            f"mvn failed (exit {result.returncode}) to fetch Kafka {version} from Maven "
            f"Central; see {log}"
        )
    (staging / ".complete").write_text(version + "\n", encoding="utf-8")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
