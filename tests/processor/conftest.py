"""The ``cluster`` fixture: topics, a client and the worker processes of one processor test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processor.harness import Cluster


@pytest.fixture
def cluster(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Iterator[Cluster]:
    group = Cluster(kafka_bootstrap, unique_prefix, tmp_path)
    try:
        yield group
    finally:
        group.close()
