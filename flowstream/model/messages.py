"""Messages on the Kafka command topics, and the dead-letter record.

Clients and processors put a :data:`CommandMessage` on a command topic keyed by its run id
(``StartRun`` on ``cmd.start``, ``SendSignal`` on ``cmd.signal``, ``ResumeHook`` and
``DisposeHook`` on ``cmd.hook``, ``CancelRun`` and ``RetryRun`` on ``cmd.cancel``, ``FireTimer``
and ``ResolveChild`` on ``cmd.timer``). A record that cannot be decoded or applied becomes a
:class:`DeadLetter` on the dead-letter topic; it is not a command and is not part of the union.

Every command a client sends (``StartRun``, ``SendSignal``, ``ResumeHook``, ``DisposeHook``,
``CancelRun``, ``RetryRun``) carries a ``command_id`` (``None`` in messages written before command
ids, and in those a processor sends itself): the processor writes the command's
:class:`CommandOutcome` under that id to the events topic (an ``outcome`` record), in the
transaction of its effect.

A ``ResumeHook`` may carry a hook token, a bearer secret: it is a ``SecretStr``, hidden from
``repr``, ``str`` and validation errors. Events never hold tokens, only their SHA-256 digest, and
neither does anything a processor writes: a resume it forwards or parks carries the digest.

Hook tokens are claimed cluster-wide on the partition of their digest: ``RegisterHookToken``
claims, ``ReleaseHookToken`` releases, and ``HookTokenRejected`` answers a claim that lost to an
active one (``docs/architecture.md``, "Hook tokens").
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from flowstream.errors import InvalidIdentifierError
from flowstream.model.base import JSON, FrozenModel, validate_identifier, validate_run_id
from flowstream.model.events import ParentLink, TerminalOutcome
from flowstream.model.spec import WorkflowSpec

__all__ = [
    "CancelRun",
    "CommandMessage",
    "CommandOutcome",
    "DeadLetter",
    "DeadLetterHeader",
    "DisposeHook",
    "FireTimer",
    "HookTokenRejected",
    "OutcomeStatus",
    "RegisterHookToken",
    "ReleaseHookToken",
    "ResolveChild",
    "ResumeHook",
    "RetryRun",
    "SendSignal",
    "StartRun",
]


def _run_id(value: str) -> str:
    try:
        return validate_run_id(value)
    except InvalidIdentifierError as exc:
        raise ValueError(str(exc)) from None


def _identifier(kind: str) -> AfterValidator:
    def check(value: str) -> str:
        try:
            return validate_identifier(kind, value)
        except InvalidIdentifierError as exc:
            raise ValueError(str(exc)) from None

    return AfterValidator(check)


#: A token digest: the hex SHA-256 of a hook token.
_DIGEST = r"^[0-9a-f]{64}$"

RunId = Annotated[str, AfterValidator(_run_id)]
SignalId = Annotated[str, _identifier("signal")]
HookId = Annotated[str, _identifier("hook")]
ChildId = Annotated[str, _identifier("child workflow")]
SubjectId = Annotated[str, _identifier("timer subject")]
CommandId = Annotated[str, _identifier("command")]


class StartRun(FrozenModel):
    """Start a run pinned to ``spec``; idempotent by run id.

    ``parent`` and ``depth`` are set when a processor starts a child run or a continuation
    whose partition it does not own; a client leaves them at their defaults.
    """

    type: Literal["start_run"] = "start_run"
    run_id: RunId
    spec: WorkflowSpec
    input: JSON = None
    parent: ParentLink | None = None
    depth: int = Field(default=0, ge=0)
    command_id: CommandId | None = None


class SendSignal(FrozenModel):
    """Deliver a signal to a run; idempotent by ``signal_id``."""

    type: Literal["send_signal"] = "send_signal"
    run_id: RunId
    signal_id: SignalId
    name: str = Field(min_length=1)
    payload: JSON = None
    command_id: CommandId | None = None


class ResumeHook(FrozenModel):
    """Resume a hook, addressed by ``run_id`` and ``hook_id``, by ``token`` alone, or by both.

    A token-only resume is keyed by the token's digest; the owner of that partition looks the
    digest up and forwards the resume to the run's partition with ``token_digest`` in place of
    the token, and the digest is checked against the hook (in constant time) before anything
    is appended. ``token_digest`` always comes with ``run_id`` and ``hook_id``: the digest is
    public (``hook_created`` holds it), so it never addresses a hook by itself, and it grants
    nothing the run and hook ids do not (a resume by run and hook id needs no token).
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    type: Literal["resume_hook"] = "resume_hook"
    token: SecretStr | None = None
    token_digest: str | None = Field(default=None, pattern=_DIGEST)
    run_id: RunId | None = None
    hook_id: HookId | None = Field(default=None, validate_default=True)
    payload: JSON = None
    command_id: CommandId | None = None

    # The address rule is a validator of the last address field, not of the model: a
    # model-level error echoes the whole input, token included, wherever a caller validates
    # this model inside a union or container that does not hide inputs.
    @field_validator("hook_id", mode="after")
    @classmethod
    def _address(cls, hook_id: str | None, info: ValidationInfo) -> str | None:
        if any(name not in info.data for name in ("token", "token_digest", "run_id")):
            return hook_id  # an earlier field failed and is reported on its own
        token: SecretStr | None = info.data["token"]
        digest: str | None = info.data["token_digest"]
        run_id: str | None = info.data["run_id"]
        if token is not None and not token.get_secret_value():
            raise ValueError("the hook token must not be empty")
        if token is not None and digest is not None:
            raise ValueError("give the hook token or its digest, not both")
        if (run_id is None) != (hook_id is None):
            raise ValueError("give run_id and hook_id together")
        if digest is not None and run_id is None:
            raise ValueError("a token digest addresses a hook only with run_id and hook_id")
        if token is None and run_id is None:
            raise ValueError("address a hook by run_id and hook_id, or by its token")
        return hook_id


class RegisterHookToken(FrozenModel):
    """Sent by a run's owner when a hook is created: claim ``token_digest`` for (run, hook) on
    the partition of the digest, so the hook can be resumed by its token alone. The first
    active claim wins; a later one is answered by ``HookTokenRejected``. ``sequence`` is the
    ``hook_created``'s sequence in its run (0 when sent by a release before it was kept)."""

    type: Literal["register_hook_token"] = "register_hook_token"
    token_digest: str = Field(pattern=_DIGEST)
    run_id: RunId
    hook_id: HookId
    sequence: int = Field(default=0, ge=0)


class ReleaseHookToken(FrozenModel):
    """Sent by a run's owner when a hook that claimed ``token_digest`` is resumed or disposed,
    or its run ends: the digest's partition drops the claim if it is still this hook's."""

    type: Literal["release_hook_token"] = "release_hook_token"
    token_digest: str = Field(pattern=_DIGEST)
    run_id: RunId
    hook_id: HookId


class HookTokenRejected(FrozenModel):
    """The answer to a claim that lost, sent to the claimant's partition: hook ``hook_id`` of
    ``run_id`` (created at ``sequence``) cannot have its token, which hook ``owner_hook_id`` of
    ``owner_run_id`` holds. The run records ``HookTokenConflictError`` and the creation is
    undone, as if ``hook_created`` had been refused (``workflow_task_failed.undone_hook``)."""

    type: Literal["hook_token_rejected"] = "hook_token_rejected"
    run_id: RunId
    hook_id: HookId
    sequence: int = Field(ge=0)
    owner_run_id: RunId
    owner_hook_id: HookId


class DisposeHook(FrozenModel):
    """Dispose of an open hook without a payload."""

    type: Literal["dispose_hook"] = "dispose_hook"
    run_id: RunId
    hook_id: HookId
    command_id: CommandId | None = None


class CancelRun(FrozenModel):
    """Request cancellation; ``force`` ends the run at once without cleanup."""

    type: Literal["cancel_run"] = "cancel_run"
    run_id: RunId
    reason: str | None = None
    force: bool = False
    command_id: CommandId | None = None


class RetryRun(FrozenModel):
    """An operator's request to drive the run again now (its code was fixed, say).

    On ``cmd.cancel``, the topic of the controls clients send about a run's lifecycle: a client
    never writes ``cmd.timer``, which only processors write (a forged ``FireTimer`` could end a
    wait early), and a retry is ordered with the cancellations of the same run.
    """

    type: Literal["retry_run"] = "retry_run"
    run_id: RunId
    command_id: CommandId | None = None


class FireTimer(FrozenModel):
    """A due timer: a wait (``subject_id`` is the wait id) or a delayed retry (the step id)."""

    type: Literal["fire_timer"] = "fire_timer"
    run_id: RunId
    kind: Literal["wait", "retry"]
    subject_id: SubjectId
    due: datetime


class ResolveChild(FrozenModel):
    """A child run's terminal outcome, sent to its parent ``run_id`` on the parent's partition."""

    type: Literal["resolve_child"] = "resolve_child"
    run_id: RunId
    child_id: ChildId
    child_run_id: RunId
    outcome: TerminalOutcome


CommandMessage = Annotated[
    StartRun
    | SendSignal
    | ResumeHook
    | DisposeHook
    | CancelRun
    | RetryRun
    | FireTimer
    | ResolveChild
    | RegisterHookToken
    | ReleaseHookToken
    | HookTokenRejected,
    Field(discriminator="type"),
]


class DeadLetterHeader(FrozenModel):
    """One Kafka header of the dead-lettered record."""

    key: str
    value: bytes | None = Field(default=None, repr=False)


class DeadLetter(FrozenModel):
    """A record that could not be decoded or applied, copied with where it came from.

    ``reason`` is built from flowstream error messages, which never contain hook tokens. The
    original ``key``, ``value`` and headers are copied as they were (a dead-lettered hook
    message may hold a token), so they are left out of ``repr`` and of validation errors.
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    type: Literal["dead_letter"] = "dead_letter"
    source_topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    key: bytes | None = Field(default=None, repr=False)
    reason: str
    value: bytes | None = Field(default=None, repr=False)
    headers: tuple[DeadLetterHeader, ...] = Field(default=(), repr=False)


class OutcomeStatus(StrEnum):
    """What became of a command (``CommandOutcome.status``)."""

    #: Its effect is recorded (a start created the run, a signal was received, ...).
    APPLIED = "applied"
    #: Nothing changed: a duplicate (a start of a run that exists with the same spec and input,
    #: a signal id already received) or a command with nothing to do (a retry of an ended run).
    NOOP = "noop"
    #: Refused, nothing of it recorded; ``error_kind`` names the ``flowstream.errors`` class.
    REJECTED = "rejected"
    #: Kept in its partition's inbox until it can apply (its run does not exist yet, its build
    #: is not served here); a later outcome with the same id says what became of it.
    PARKED = "parked"
    #: Passed on to the run ``forwarded_to`` (a hook resumed by its token alone goes on to the
    #: hook's run), whose partition writes the next outcome with the same id.
    FORWARDED = "forwarded"


class CommandOutcome(FrozenModel):
    """What the processor did with one command: the value of an outcomes-topic record, written
    in the transaction of the command's effect, keyed like the command (its run id, or a
    token-only hook resumption's digest) on the partition of that key.

    ``reason`` is built from flowstream error messages, which never hold hook tokens.
    """

    type: Literal["command_outcome"] = "command_outcome"
    command_id: CommandId
    #: The command's key: the run it addresses (a token-only resume: the token's digest).
    key: str = Field(min_length=1)
    #: The command's type literal, e.g. ``send_signal``.
    command: str = Field(min_length=1)
    status: OutcomeStatus
    reason: str | None = None
    #: The ``flowstream.errors`` class a client raises for a rejection, e.g. ``RunConflictError``.
    error_kind: str | None = None
    forwarded_to: RunId | None = None
    #: Where the command was read: ``topic[partition]@offset``.
    source: str = ""

    @property
    def final(self) -> bool:
        """No later outcome follows for this command id (it is not parked or forwarded)."""
        return self.status not in (OutcomeStatus.PARKED, OutcomeStatus.FORWARDED)
