"""``flowstream worker`` options and environment, without a broker."""

from __future__ import annotations

import os
import subprocess
import sys

from flowstream.cli import build_parser
from flowstream.cli.worker import worker_settings
from flowstream.processor.txn.slot import new_writer, transactional_ids


def test_eager_steps_comes_from_the_flag_or_the_environment_and_is_off_by_default() -> None:
    parser = build_parser()
    plain = parser.parse_args(["worker", "--app", "flowstream.examples.order:runtime"])
    flagged = parser.parse_args(["worker", "--eager-steps"])
    assert worker_settings(plain, {}).eager_steps is False
    assert worker_settings(flagged, {}).eager_steps is True
    assert worker_settings(plain, {"FLOWSTREAM_EAGER_STEPS": "true"}).eager_steps is True
    # An option given on the command line wins over the environment; one not given leaves it.
    bootstrap = parser.parse_args(["worker", "--bootstrap", "127.0.0.1:1"])
    env = {"FLOWSTREAM_BOOTSTRAP": "127.0.0.1:2", "FLOWSTREAM_GROUP": "g"}
    settings = worker_settings(bootstrap, env)
    assert (settings.bootstrap, settings.group) == ("127.0.0.1:1", "g")


def test_a_bad_setting_is_one_line_and_exit_2_not_a_traceback() -> None:
    for args, env, wanted in (
        (["--instance-id", "a/b"], {}, "instance_id: instance id 'a/b' must be non-empty"),
        ([], {"FLOWSTREAM_COMMIT_INTERVAL_MS": "0"}, "commit_interval_ms: Input should be"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "flowstream", "worker", "--bootstrap", "127.0.0.1:1", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: {wanted}"), done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_transactional_ids_of_two_group_and_instance_pairs_never_collide() -> None:
    pairs = [("a-b", "c"), ("a", "b-c"), ("a/b", "c"), ("a", "b"), ("a/b/c", "1"), ("a", "b")]
    writers = [(group, new_writer(instance)) for group, instance in pairs]
    ids = [i for group, writer in writers for i in transactional_ids(group, writer)]
    assert len(set(ids)) == len(ids)
