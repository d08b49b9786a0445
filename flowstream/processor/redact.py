"""Hook tokens never at rest: what a processor keeps or copies of a command holds no token.

A client's ``ResumeHook`` on ``cmd.hook`` is the one record that holds a token (the bearer
secret must reach the processor once). Everything a processor writes holds at most its
SHA-256 digest, which is public (``hook_created`` holds it) and addresses a hook only together
with its run and hook id, which address it without any token:

* a resume that must wait is parked (RocksDB and the ``inbox`` record) with the digest in place
  of the token, and so is one an earlier release parked, when restore reads it back;
* a dead letter of a ``cmd.hook`` record carries the redacted value, or none when the token
  was its only address or the value cannot be read (it may hold a token);
* a token-only resume is forwarded to its hook's run with the digest (``HookTokens.forward``).
"""

from __future__ import annotations

from flowstream import codec
from flowstream.errors import FlowError
from flowstream.model.messages import ResumeHook
from flowstream.replay.decide import token_digest

__all__ = ["presented_digest", "redacted"]


def redacted(raw: bytes, *, may_hold_token: bool = True) -> bytes | None:
    """``raw`` without a hook token: a ``ResumeHook`` holding one is encoded again with its
    digest in its place, or is ``None`` when the token was its only address (the digest alone
    addresses nothing). A value that cannot be read is returned as it is, unless it
    ``may_hold_token`` (it came from ``cmd.hook``): then ``None``, it is not kept."""
    try:
        command = codec.decode_command(raw)
    except FlowError:
        return None if may_hold_token else raw
    if not isinstance(command, ResumeHook) or command.token is None:
        return raw
    if command.run_id is None:
        return None
    digest = token_digest(command.token.get_secret_value())
    return codec.encode_message(command.model_copy(update={"token": None, "token_digest": digest}))


def presented_digest(command: ResumeHook) -> str | None:
    """The digest a resume presents: of its token, or the one forwarded in its place."""
    if command.token is not None:
        return token_digest(command.token.get_secret_value())
    return command.token_digest
