"""Kafka's jars without Maven: fetched one by one from Maven Central, each checked against the
SHA-256 recorded in ``jars.lock`` (beside this module) before it is kept.

Downloads go to an artifact cache in Maven's repository layout (``<cache root>/maven``, or
``FLOWSTREAM_JAR_CACHE``), so a second ``libs`` directory, another cache root or a rebuilt one
costs no download; ``libs/`` gets copies (a damaged copy never damages the cache).
``FLOWSTREAM_MAVEN_REPOSITORY`` names a mirror in place of Maven Central. A file is written as
``.part`` and renamed only once its digest matched, so an interrupted fetch leaves nothing that
looks complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from flowstream.devkafka.errors import DevKafkaError

__all__ = ["CENTRAL", "LockedJar", "check_libs", "fetch_locked", "locked_jars"]

CENTRAL = "https://repo.maven.apache.org/maven2/"
_LOCK = "jars.lock"
_TIMEOUT_S = 60
_CHUNK = 1 << 20


@dataclass(frozen=True)
class LockedJar:
    """One jar of the lock: its path in the repository layout and its SHA-256."""

    path: str
    sha256: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def locked_jars(version: str) -> list[LockedJar] | None:
    """The jars recorded for Kafka ``version``, or ``None`` when the lock is for another."""
    text = resources.files("flowstream.devkafka").joinpath(_LOCK).read_text(encoding="utf-8")
    lines = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    if not lines or lines[0] != ["kafka", version]:
        return None
    return [LockedJar(path, digest) for digest, path in lines[1:]]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _refuse(where: object, found: str, jar: LockedJar, remedy: str) -> DevKafkaError:
    return DevKafkaError(
        f"{where} does not match the SHA-256 recorded for {jar.name} in flowstream/devkafka/"
        f"{_LOCK} (found {found[:16]}…, recorded {jar.sha256[:16]}…): the file is damaged or "
        f"not that artifact; {remedy}"
    )


def check_libs(libs: Path, jars: list[LockedJar]) -> None:
    """Every jar of ``libs`` is a locked one with its recorded digest, and none is missing."""
    wanted = {jar.name: jar for jar in jars}
    present = {path.name for path in libs.glob("*.jar")}
    missing = sorted(set(wanted) - present)
    if missing:
        raise DevKafkaError(
            f"{libs} lacks {', '.join(missing)}: delete {libs} to fetch the jars again"
        )
    unknown = sorted(present - set(wanted))
    if unknown:
        raise DevKafkaError(
            f"{libs} holds jars the lock does not record ({', '.join(unknown)}): delete {libs} "
            "to fetch the jars again"
        )
    for name, jar in sorted(wanted.items()):
        found = sha256_of(libs / name)
        if found != jar.sha256:
            raise _refuse(libs / name, found, jar, f"delete {libs} to fetch the jars again")


def artifact_cache(cache_root: Path) -> Path:
    configured = os.environ.get("FLOWSTREAM_JAR_CACHE")
    return Path(configured).expanduser() if configured else cache_root / "maven"


def fetch_locked(cache_root: Path, libs: Path, jars: list[LockedJar]) -> None:
    """Fill ``libs`` with the locked jars, from the artifact cache or else downloaded."""
    downloads = artifact_cache(cache_root)
    base = os.environ.get("FLOWSTREAM_MAVEN_REPOSITORY", CENTRAL).rstrip("/") + "/"
    staging = libs.with_name(libs.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for jar in jars:
        kept = downloads / jar.path
        if kept.is_file():
            found = sha256_of(kept)
            if found != jar.sha256:
                raise _refuse(kept, found, jar, "delete it to download it again")
        else:
            _download(base + jar.path, kept, jar)
        shutil.copyfile(kept, staging / jar.name)
    (staging / ".complete").write_text("fetched without Maven\n", encoding="utf-8")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)


def _download(url: str, target: Path, jar: LockedJar) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as answer, part.open("wb") as out:
            while chunk := answer.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        part.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise DevKafkaError(
            f"could not download {jar.name} from {url} ({reason}): without Maven, dev-kafka "
            "fetches the Kafka jars itself and needs the network once (or install Maven, or "
            "set FLOWSTREAM_MAVEN_REPOSITORY to a mirror)"
        ) from None
    found = digest.hexdigest()
    if found != jar.sha256:
        part.unlink(missing_ok=True)
        raise _refuse(url, found, jar, "nothing was kept; is the mirror serving it?")
    part.rename(target)
