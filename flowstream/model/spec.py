"""What a run is pinned to: the workflow spec, retry policies and patch markers."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from flowstream.model.base import FrozenModel

__all__ = [
    "DEFAULT_RETRY",
    "MAX_PATCH_MARKERS",
    "Backoff",
    "ExhaustedAction",
    "RetryPolicy",
    "WorkflowSpec",
]

MAX_PATCH_MARKERS = 256
_PATCH_ID = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,126}[a-z0-9])?")
_BAD_BUILD = re.compile(r"[\s\\]")


class Backoff(StrEnum):
    FIXED = "fixed"
    EXPONENTIAL = "exponential"


class ExhaustedAction(StrEnum):
    """What happens when a step runs out of attempts."""

    FAIL_RUN = "fail_run"
    CONTINUE_WORKFLOW = "continue_workflow"


class RetryPolicy(FrozenModel):
    """Attempts (including the first), delay and backoff for one step.

    The default is three immediate attempts that fail the run when exhausted. Build one by
    keyword, with delays as ``timedelta``::

        RetryPolicy(max_attempts=5, delay=timedelta(seconds=1))                 # fixed
        RetryPolicy(max_attempts=5, delay=timedelta(milliseconds=200),
                    backoff="exponential", max_delay=timedelta(seconds=5))

    or with ``fixed``/``exponential``. The stored form counts milliseconds (``delay_ms``,
    ``max_delay_ms``), which are accepted too.
    """

    max_attempts: int = Field(default=3, ge=1, le=10_000)
    delay_ms: int = Field(default=0, ge=0)
    backoff: Backoff = Backoff.FIXED
    max_delay_ms: int = Field(default=0, ge=0)
    on_exhausted: ExhaustedAction = ExhaustedAction.FAIL_RUN

    def __init__(
        self,
        *,
        max_attempts: int = 3,
        delay: timedelta | None = None,
        backoff: Backoff | Literal["fixed", "exponential"] = Backoff.FIXED,
        max_delay: timedelta | None = None,
        on_exhausted: ExhaustedAction | Literal["fail_run", "continue_workflow"] = (
            ExhaustedAction.FAIL_RUN
        ),
        delay_ms: int | None = None,
        max_delay_ms: int | None = None,
        **unknown: Any,  # refused by validation, as for any model
    ) -> None:
        fields: dict[str, Any] = {
            **unknown,
            "max_attempts": max_attempts,
            "delay_ms": _milliseconds("delay", delay, delay_ms),
            "backoff": backoff,
            "max_delay_ms": _milliseconds("max_delay", max_delay, max_delay_ms),
            "on_exhausted": on_exhausted,
        }
        super().__init__(**fields)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.backoff is Backoff.FIXED and self.max_delay_ms:
            raise ValueError("max_delay_ms only applies to exponential backoff")
        if self.backoff is Backoff.EXPONENTIAL:
            if self.delay_ms < 1:
                raise ValueError("exponential backoff needs delay_ms >= 1")
            if self.max_delay_ms < self.delay_ms:
                raise ValueError("exponential backoff needs max_delay_ms >= delay_ms")
        return self

    @classmethod
    def none(cls) -> RetryPolicy:
        """One attempt, no retry."""
        return cls(max_attempts=1)

    @classmethod
    def fixed(cls, max_attempts: int, delay: int | timedelta) -> RetryPolicy:
        """``max_attempts`` attempts, ``delay`` (milliseconds or a ``timedelta``) apart."""
        return cls(max_attempts=max(1, max_attempts), delay_ms=_as_ms(delay))

    @classmethod
    def exponential(
        cls, max_attempts: int, initial: int | timedelta, maximum: int | timedelta
    ) -> RetryPolicy:
        """Delays doubling from ``initial`` up to ``maximum`` (milliseconds or ``timedelta``),
        with full jitter."""
        return cls(
            max_attempts=max(1, max_attempts),
            delay_ms=_as_ms(initial),
            backoff=Backoff.EXPONENTIAL,
            max_delay_ms=_as_ms(maximum),
        )

    def continue_workflow_on_failure(self) -> RetryPolicy:
        """The same policy, handing exhaustion back to workflow code (``step_failed``)."""
        return self.model_copy(update={"on_exhausted": ExhaustedAction.CONTINUE_WORKFLOW})

    def delay_for(self, run_id: str, step_id: str, attempt: int) -> int:
        """Delay in ms after failed ``attempt`` (1-based); deterministic for the same inputs.

        Exponential backoff uses full jitter drawn from SHA-256 of (run, step, attempt), so a
        replay or another processor computes the same deadline.
        """
        if self.backoff is Backoff.FIXED:
            return self.delay_ms
        cap = min(self.delay_ms * (1 << min(attempt - 1, 62)), self.max_delay_ms)
        digest = hashlib.sha256()
        digest.update(b"flowstream.retry-jitter.v1")
        for part in (run_id.encode(), step_id.encode()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        digest.update(attempt.to_bytes(4, "big"))
        return 1 + int.from_bytes(digest.digest()[:8], "big") % cap


def _as_ms(delay: int | timedelta) -> int:
    if isinstance(delay, timedelta):
        return round(delay.total_seconds() * 1000)
    return delay


def _milliseconds(name: str, delay: timedelta | None, ms: int | None) -> int:
    if delay is not None and ms is not None:
        raise ValueError(f"give {name} or {name}_ms, not both")
    if delay is not None:
        return _as_ms(delay)
    return 0 if ms is None else ms


#: The policy of a step scheduled without one (models are frozen, so one instance serves all).
DEFAULT_RETRY = RetryPolicy()


class WorkflowSpec(FrozenModel):
    """The definition a run is pinned to at creation; continuations inherit it unchanged."""

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(default="1", min_length=1, max_length=100)
    runtime_build_id: str | None = None
    patch_markers: tuple[str, ...] = ()
    signal_names: tuple[str, ...] = ()
    kind: Literal["python"] = "python"

    @field_validator("runtime_build_id")
    @classmethod
    def _build_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if (
            not value
            or len(value) > 200
            or _BAD_BUILD.search(value)
            or value.startswith("-")
            or value.endswith("/")
        ):
            raise ValueError(f"invalid runtime_build_id {value!r}")
        return value

    @field_validator("patch_markers")
    @classmethod
    def _markers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_PATCH_MARKERS:
            raise ValueError(f"at most {MAX_PATCH_MARKERS} patch markers")
        if len(set(value)) != len(value):
            raise ValueError("duplicate patch marker")
        for marker in value:
            if not _PATCH_ID.fullmatch(marker):
                raise ValueError(
                    f"invalid patch marker {marker!r}: 1-128 lowercase letters, digits, '.-_', "
                    "starting and ending with a letter or digit"
                )
        return tuple(sorted(value))

    @field_validator("signal_names")
    @classmethod
    def _signals(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name for name in value):
            raise ValueError("signal names must be non-empty")
        return tuple(sorted(set(value)))

    def has_patch_marker(self, marker: str) -> bool:
        return marker in self.patch_markers
