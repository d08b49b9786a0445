"""The ``flowstream kafka`` argument parser, without a broker."""

from __future__ import annotations

import argparse

import pytest

from flowstream.cli import build_parser
from flowstream.cli.kafka import load_spec
from flowstream.examples.order import SPEC


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("path", [("kafka", "hook"), ("hook",)])
def test_no_option_takes_a_hook_token_as_an_argument(path: tuple[str, ...]) -> None:
    hook = _subparser(build_parser(), *path)
    token_options = [a for a in hook._actions if "token" in a.dest]
    assert [a.option_strings for a in token_options] == [["--token-stdin"]]
    assert all(a.nargs == 0 for a in token_options)  # a flag: the token itself comes from stdin


def test_every_verb_is_there_with_the_connection_options() -> None:
    kafka = _subparser(build_parser(), "kafka")
    (verbs,) = [a for a in kafka._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(verbs.choices) == {
        "start", "wait", "status", "history", "list", "describe", "signal", "hook", "cancel",
        "retry", "outcome", "repartition", "gateway",
    }  # fmt: skip
    for verb in verbs.choices.values():
        options = {o for a in verb._actions for o in a.option_strings}
        assert {"--bootstrap", "--prefix", "--topology", "--timeout"} <= options


def test_start_takes_the_spec_input_and_wait() -> None:
    args = build_parser().parse_args(
        ["kafka", "start", "r-1", "--workflow", "flowstream.examples.order", "--wait"]
    )
    assert (args.run_id, args.workflow, args.input, args.wait) == (
        "r-1",
        "flowstream.examples.order",
        "null",
        True,
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["kafka", "start", "r-1"])  # --workflow is required


def test_load_spec_defaults_to_the_spec_attribute() -> None:
    assert load_spec("flowstream.examples.order") is SPEC
    assert load_spec("flowstream.examples.order:SPEC") is SPEC


def test_list_takes_the_filters_paging_and_index_directory() -> None:
    args = build_parser().parse_args(
        [
            *("kafka", "list", "--status", "suspended", "--workflow", "order", "--json"),
            *("--limit", "10", "--cursor", "abc", "--index-dir", "idx", "--rebuild"),
        ]
    )
    assert (args.status, args.workflow, args.json, args.limit, args.cursor) == (
        ["suspended"],
        ["order"],
        True,
        10,
        "abc",
    )
    assert str(args.index_dir) == "idx" and args.rebuild
