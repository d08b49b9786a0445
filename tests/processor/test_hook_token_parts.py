"""The pure parts of the cluster-wide hook-token claims (no broker): the claim index of a
partition store, the undone hook creation in a run's projection, and redaction.

The claims end to end, across partitions on the real broker, are ``test_hook_tokens.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from flowstream import codec
from flowstream.errors import InvalidTransitionError
from flowstream.model.events import (
    HookCreated,
    RunCreated,
    RunStarted,
    WorkflowTaskFailed,
)
from flowstream.model.messages import ResumeHook, SendSignal
from flowstream.processor.redact import presented_digest, redacted
from flowstream.replay.decide import token_digest
from flowstream.replay.task_failures import TaskRetryPolicy, task_failed_events
from flowstream.stores.partition import PartitionStore
from tests.support import FakeClock, spec

SPEC = spec("tokens")
TOKEN = "claim-me-" + "q" * 40
DIGEST = token_digest(TOKEN)


def new_store(path: Path, *, local: bool = True) -> PartitionStore:
    return PartitionStore(0, path, lambda *_: None, clock=FakeClock(), local_token_claims=local)


def test_a_claim_is_held_until_its_own_hook_releases_it(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    assert store.hook_token_claim(DIGEST) is None
    store.claim_hook_token(DIGEST, "first", "h")
    assert store.hook_token_claim(DIGEST) == ("first", "h")
    assert not store.release_hook_token(DIGEST, "second", "h")  # not its claim
    assert not store.release_hook_token(DIGEST, "first", "other")
    assert store.hook_token_owner(DIGEST) == ("first", "h")
    store.commit_local(None)
    assert store.release_hook_token(DIGEST, "first", "h")
    assert store.hook_token_claim(DIGEST) is None  # staged delete answers before the write
    store.commit_local(None)
    store.close()
    reopened = new_store(tmp_path / "p")
    assert reopened.hook_token_claim(DIGEST) is None
    # A late resume by the token still goes to the hook that held it, whose run answers it.
    assert reopened.hook_token_owner(DIGEST) == ("first", "h")
    reopened.claim_hook_token(DIGEST, "second", "h")
    assert reopened.hook_token_owner(DIGEST) == ("second", "h")


def test_an_earlier_registration_routes_but_never_blocks_a_claim(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    store.index_hook_token(DIGEST, "legacy", "h")  # a hook-token record of an earlier release
    assert store.hook_token_claim(DIGEST) is None
    assert store.hook_token_owner(DIGEST) == ("legacy", "h")
    store.claim_hook_token(DIGEST, "new", "h")
    assert store.hook_token_owner(DIGEST) == ("new", "h")
    assert not store.release_hook_token(DIGEST, "legacy", "h")  # it holds no claim
    assert store.release_hook_token(DIGEST, "new", "h")
    assert store.hook_token_claim(DIGEST) is None
    assert store.hook_token_owner(DIGEST) == ("new", "h")  # the last holder


def test_claims_survive_a_sealed_commit_and_vanish_with_a_discard(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    store.claim_hook_token(DIGEST, "sealed", "h")
    store.seal()
    store.release_hook_token(DIGEST, "sealed", "h")
    assert store.hook_token_claim(DIGEST) is None
    store.commit_sealed(None)
    assert store.hook_token_claim(DIGEST) is None  # the open release still answers
    store.discard()  # the release aborted: the committed claim is back
    assert store.hook_token_claim(DIGEST) == ("sealed", "h")


def test_a_processor_store_leaves_token_conflicts_to_the_claims(tmp_path: Path) -> None:
    for local, conflicts in ((True, True), (False, False)):
        store = new_store(tmp_path / f"p-{local}", local=local)
        for run_id in ("a", "b"):
            store.append_if_sequence(run_id, 0, [RunCreated(spec=SPEC), RunStarted()])
        store.append_if_sequence("a", 2, [HookCreated(hook_id="h", token_digest=DIGEST)])
        if conflicts:
            with pytest.raises(Exception, match="already active"):
                store.append_if_sequence("b", 2, [HookCreated(hook_id="h", token_digest=DIGEST)])
        else:
            store.append_if_sequence("b", 2, [HookCreated(hook_id="h", token_digest=DIGEST)])
            assert store.hook_token_claim(DIGEST) is None  # claims are another partition's
        store.close()


def test_a_lost_claim_undoes_the_hook_and_the_retried_task_creates_it_again(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path / "p", local=False)
    store.append_if_sequence("r", 0, [RunCreated(spec=SPEC), RunStarted()])
    store.append_if_sequence("r", 2, [HookCreated(hook_id="h", token_digest=DIGEST)])
    state = store.state("r")
    assert state.hooks["h"].sequence == 3
    events = task_failed_events(
        state, "HookTokenConflictError", "held", FakeClock()(), TaskRetryPolicy(), undone_hook="h"
    )
    store.append_if_sequence("r", 3, events)
    state = store.state("r")
    assert "h" not in state.hooks and "h" not in state.active_hooks
    assert state.task_failure is not None
    assert state.task_failure.error_type == "HookTokenConflictError"
    store.append_if_sequence("r", 4, [HookCreated(hook_id="h", token_digest=DIGEST)])
    state = store.state("r")
    assert state.hooks["h"].sequence == 5 and state.task_failure is None


def test_only_an_active_hook_can_be_undone(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p", local=False)
    store.append_if_sequence("r", 0, [RunCreated(spec=SPEC), RunStarted()])
    with pytest.raises(InvalidTransitionError, match="undoes hook h"):
        store.append_if_sequence(
            "r", 2, [WorkflowTaskFailed(attempt=1, error_type="E", message="m", undone_hook="h")]
        )


def test_a_resume_is_kept_with_the_digest_in_place_of_its_token() -> None:
    raw = codec.encode_message(
        ResumeHook(
            run_id="r", hook_id="h", token=SecretStr(TOKEN), payload={"ok": 1}, command_id="c-7"
        )
    )
    safe = redacted(raw)
    assert safe is not None and TOKEN.encode() not in safe
    command = codec.decode_command(safe)
    assert isinstance(command, ResumeHook) and command.token is None
    assert command.token_digest == DIGEST and presented_digest(command) == DIGEST
    assert (command.run_id, command.hook_id, command.payload) == ("r", "h", {"ok": 1})
    assert command.command_id == "c-7"


def test_what_cannot_be_kept_without_its_token_is_not_kept() -> None:
    token_only = codec.encode_message(ResumeHook(token=SecretStr(TOKEN)))
    assert redacted(token_only) is None  # the digest alone addresses nothing
    garbage = b"\xc3\x01" + TOKEN.encode()
    assert redacted(garbage) is None  # from cmd.hook: it may hold a token
    assert redacted(garbage, may_hold_token=False) == garbage
    signal = codec.encode_message(SendSignal(run_id="r", signal_id="s", name="go"))
    assert redacted(signal) == signal


def test_a_digest_addresses_a_hook_only_with_its_run_and_hook_ids() -> None:
    with pytest.raises(ValueError, match="only with run_id and hook_id"):
        ResumeHook(token_digest=DIGEST)
    with pytest.raises(ValueError, match="not both"):
        ResumeHook(run_id="r", hook_id="h", token=SecretStr(TOKEN), token_digest=DIGEST)
    with pytest.raises(ValueError) as caught:
        ResumeHook(token=SecretStr(TOKEN), token_digest=DIGEST)
    assert TOKEN not in str(caught.value)


def test_waiting_claimants_are_taken_once(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    store.add_token_waiter(DIGEST, "second", "h")
    store.commit_local(None)
    store.add_token_waiter(DIGEST, "third", "h")
    store.add_token_waiter(token_digest("other"), "fourth", "h")
    store.commit_local(None)
    assert store.next_wakeup() is None  # no key of the wakeup index (or of any other)
    assert store.take_token_waiters(DIGEST) == ["second", "third"]
    assert store.take_token_waiters(DIGEST) == []
    store.commit_local(None)
    assert store.take_token_waiters(DIGEST) == []
    assert store.take_token_waiters(token_digest("other")) == ["fourth"]
