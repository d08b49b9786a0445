"""A hook token is a bearer secret: no repr, str, validation error or codec error shows it."""

from __future__ import annotations

import io
import traceback
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from pydantic import SecretStr, TypeAdapter, ValidationError

from flowstream import codec
from flowstream.codec import MARKER
from flowstream.errors import SerializationError
from flowstream.model.messages import CommandMessage, DeadLetter, ResumeHook
from tests.codec.samples import TOKEN

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
FRAGMENT = TOKEN[8:20]  # any recognisable part of the token counts as a leak


def _leaks(text: str) -> bool:
    return FRAGMENT in text or TOKEN.encode().hex()[16:40] in text


def _everything_about(exc: BaseException) -> str:
    """What a log could show: message, repr, the printed traceback with its causes."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


def _resume_hook_bytes(datum: dict[str, Any]) -> bytes:
    schema = load_schema(str(SCHEMAS / "flowstream.message.ResumeHook.avsc"))
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    buffer = io.BytesIO()
    buffer.write(MARKER + fp)
    fastavro.schemaless_writer(buffer, schema, {"payload": b"null", **datum})
    return buffer.getvalue()


def test_repr_str_and_json_dump_mask_the_token() -> None:
    hook = ResumeHook(token=TOKEN, payload={"ok": True})
    for text in (repr(hook), str(hook), hook.model_dump_json(), repr(hook.model_dump())):
        assert not _leaks(text), text
    assert "**********" in repr(hook)
    assert hook.token is not None and hook.token.get_secret_value() == TOKEN


@pytest.mark.parametrize(
    "fields",
    [
        {"token": TOKEN, "hook_id": "h1"},
        {"token": TOKEN, "run_id": "not valid!"},
        {"token": TOKEN, "payload": object()},
        {"token": TOKEN, "surprise": 1},
    ],
    ids=["token-and-hook", "bad-run-id", "bad-payload", "extra-field"],
)
def test_validation_errors_never_show_the_token(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as direct:
        ResumeHook(**fields)
    assert not _leaks(_everything_about(direct.value))
    with pytest.raises(ValidationError) as in_union:
        TypeAdapter(CommandMessage).validate_python({"type": "resume_hook", **fields})
    assert not _leaks(_everything_about(in_union.value))
    assert not _leaks(str(in_union.value.errors(include_input=False)))


def test_the_hook_address_rules() -> None:
    assert ResumeHook(run_id="r1", hook_id="h1").token is None
    assert ResumeHook(token=SecretStr(TOKEN)).run_id is None
    # A processor forwards a token-only resume to the run's partition with the ids added.
    forwarded = ResumeHook(token=SecretStr(TOKEN), run_id="r1", hook_id="h1")
    assert forwarded.run_id == "r1" and forwarded.token is not None
    for fields in ({}, {"run_id": "r1"}, {"hook_id": "h1"}, {"token": ""}):
        with pytest.raises(ValidationError, match=r"address a hook|must not be empty|together"):
            ResumeHook(**fields)


def test_the_token_travels_in_clear_to_the_processor() -> None:
    data = codec.encode_message(ResumeHook(token=TOKEN))
    assert TOKEN.encode() in data  # documented: cmd.hook holds secrets
    decoded = codec.decode_command(data, ResumeHook)
    assert decoded.token is not None and decoded.token.get_secret_value() == TOKEN


def test_decoding_errors_never_show_the_token() -> None:
    good = codec.encode_message(ResumeHook(token=TOKEN, payload=[1, 2, 3]))
    invalid_utf8 = bytearray(good)
    invalid_utf8[good.index(TOKEN.encode()) + 10] = 0xFF
    cases = {
        "truncated": good[:-3],
        "trailing": good + b"\x00",
        "invalid-utf8": bytes(invalid_utf8),
        "token-and-run": _resume_hook_bytes({"token": TOKEN, "run_id": "r1"}),
        "bad-run-id": _resume_hook_bytes({"token": TOKEN, "run_id": "no good", "hook_id": "h"}),
        "bad-json": _resume_hook_bytes({"token": TOKEN, "payload": b"{" + TOKEN.encode()}),
        "empty-token": _resume_hook_bytes({"token": ""}),
    }
    for name, data in cases.items():
        with pytest.raises(SerializationError) as caught:
            codec.decode_command(data)
        text = _everything_about(caught.value)
        assert not _leaks(text), (name, text)
        assert "ResumeHook" in str(caught.value), name


def test_encoding_errors_never_show_the_token() -> None:
    for hook in (
        ResumeHook(token=TOKEN + "\ud800", payload=None),
        ResumeHook(token=TOKEN, payload=[float("nan")]),
    ):
        with pytest.raises(SerializationError) as caught:
            codec.encode_message(hook)
        assert not _leaks(_everything_about(caught.value))


def test_a_dead_letter_hides_the_original_record() -> None:
    raw = codec.encode_message(ResumeHook(token=TOKEN))
    letter = DeadLetter(
        source_topic="flowstream.cmd.hook",
        partition=0,
        offset=7,
        key=b"r1",
        reason="run r1 does not exist",
        value=raw,
    )
    assert not _leaks(repr(letter)) and not _leaks(str(letter))
    assert codec.decode_dead_letter(codec.encode_message(letter)).value == raw
    with pytest.raises(ValidationError) as caught:
        DeadLetter(source_topic="", partition=-1, offset=0, reason="x", value=raw)
    assert not _leaks(_everything_about(caught.value))
    corrupt = codec.encode_message(letter)[:-2]
    with pytest.raises(SerializationError) as decoding:
        codec.decode_dead_letter(corrupt)
    assert not _leaks(_everything_about(decoding.value))
