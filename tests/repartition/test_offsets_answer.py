"""``repartition.plan.offsets`` takes no negative offset as a partition's offset.

An admin client's ``list_offsets`` request that times out on a dead leader is answered -1001
without an error (seen on the three-broker cluster in session V, where it emptied three
processor stores before ``restore.Targets`` was fixed). ``offsets`` took that answer as the
partition's offset. It now asks such a partition again with a new client, which looks its
leader up afresh, and fails with a clear message once its time has passed.

The admin client is faked at ``list_offsets``: the test is about what the move makes of the
answer. That a dead leader is answered so is shown against the real cluster by
``tests/processor/test_restore_targets.py``."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.repartition import plan
from flowstream.repartition.plan import MoveError, offsets


class _Admin:
    """Answers partition 0 with the next of ``answers`` and every other partition with 7."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers

    def list_offsets(self, asked: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        found: dict[Any, Future[Any]] = {}
        for tp in asked:
            future: Future[Any] = Future()
            offset = self.answers.pop(0) if tp.partition == 0 else 7
            future.set_result(SimpleNamespace(offset=offset))
            found[tp] = future
        return found


def _admins(monkeypatch: pytest.MonkeyPatch, answers: list[int]) -> list[_Admin]:
    made: list[_Admin] = []

    def new_admin(bootstrap: str, overrides: Any = None) -> _Admin:
        made.append(_Admin(answers))
        return made[-1]

    monkeypatch.setattr(clients, "new_admin", new_admin)
    return made


def test_an_answer_of_minus_1001_is_asked_again_with_a_new_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _admins(monkeypatch, [-1001, 42])
    found = offsets("127.0.0.1:1", [("t.events", 0), ("t.events", 1)], latest=True)
    assert found == {("t.events", 0): 42, ("t.events", 1): 7}
    assert len(made) == 2


def test_a_partition_never_answered_fails_the_move_with_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan, "_REQUEST_S", 0.3)
    _admins(monkeypatch, [-1001] * 100)
    with pytest.raises(MoveError, match=r"t\.events\[0\]: answered -1001"):
        offsets("127.0.0.1:1", [("t.events", 0)], latest=True)
