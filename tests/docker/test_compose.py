"""``docker/`` without a Docker engine: the compose file and the Dockerfile, read as text, must
agree with ``topology/``, the dev launcher's one-node broker settings, the real CLI parser and
``pyproject.toml``. (``docker/test.sh`` builds and runs them; ``.ci/run`` calls it.)

Each check returns the problems it finds; the tests assert there are none in the shipped files,
and that each check does find the problem in a copy broken on purpose.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import io
import json
import re
import shlex
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from flowstream.cli import UsageError, build_parser
from flowstream.cli.local import load_runtime
from flowstream.devkafka.config import NodeSpec, server_properties
from flowstream.devkafka.jars import KAFKA_VERSION
from flowstream.settings import Settings
from flowstream.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
REQUIREMENTS = DOCKER / "requirements.txt"
KAFKA_SERVICE = "kafka"

Compose = dict[str, Any]

#: Broker settings a one-node cluster must share with the dev launcher's (``flowstream dev-kafka``).
ONE_NODE_KEYS = (
    "process.roles",
    "auto.create.topics.enable",
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    "group.initial.rebalance.delay.ms",
    "group.min.session.timeout.ms",
    "group.consumer.min.session.timeout.ms",
    "group.consumer.min.heartbeat.interval.ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "offsets.topic.segment.bytes",
    "transaction.state.log.segment.bytes",
    "log.cleaner.backoff.ms",
    "min.insync.replicas",
    "default.replication.factor",
    "unclean.leader.election.enable",
)


# -- reading the files --------------------------------------------------------------------


_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str, environ: dict[str, str] | None = None) -> str:
    """Compose's ``${NAME:-default}``: from ``environ`` (none: every default), else the default."""
    env = environ or {}
    return _VARIABLE.sub(lambda m: env.get(m.group(1)) or m.group(2) or "", text)


def load_compose(environ: dict[str, str] | None = None) -> Compose:
    data: Compose = yaml.safe_load(interpolate(COMPOSE.read_text(), environ))
    return data


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings, from either compose form (mapping or list)."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: json.dumps(v) if isinstance(v, bool) else str(v) for k, v in raw.items()}


def kafka_env_name(key: str) -> str:
    """The apache/kafka image's variable for a setting: ``a.b_c-d`` -> ``KAFKA_A_B__C___D``."""
    return "KAFKA_" + key.replace("-", "___").replace("_", "__").replace(".", "_").upper()


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    found = {}
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        found[name.strip()] = (host, int(port))
    return found


@dataclass(frozen=True)
class PortMapping:
    host_ip: str
    host_port: int
    container_port: int


def port_mappings(service: dict[str, Any]) -> list[PortMapping]:
    mappings = []
    for entry in service.get("ports") or []:
        parts = str(entry).split(":")
        host_ip = parts[0] if len(parts) == 3 else ""
        mappings.append(PortMapping(host_ip, int(parts[-2]), int(parts[-1].split("/")[0])))
    return mappings


def flowstream_services(compose: Compose) -> dict[str, dict[str, Any]]:
    """Services built from ``docker/Dockerfile`` (they run the ``flowstream`` entrypoint)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if isinstance(service.get("build"), dict)
        and service["build"].get("dockerfile") == "docker/Dockerfile"
    }


def parse(argv: list[str]) -> Any:
    """Parse with the real CLI parser; raise ``ValueError`` with argparse's message if rejected."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            return build_parser().parse_args(argv)
        except SystemExit:
            raise ValueError(errors.getvalue().strip().splitlines()[-1]) from None


@dataclass
class Dockerfile:
    """The instructions of a Dockerfile that the checks need."""

    base: str = ""
    entrypoint: object = None
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    user: str = "root"
    healthcheck: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Dockerfile:
        parsed = cls()
        logical = []
        pending = ""
        for line in text.splitlines():
            if not pending and line.lstrip().startswith("#"):
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            if line.strip() or pending:
                logical.append(pending + line)
            pending = ""
        for line in logical:
            instruction, _, rest = line.strip().partition(" ")
            rest = rest.strip()
            match instruction.upper():
                case "ARG":
                    name, _, default = rest.partition("=")
                    parsed.args[name] = default
                case "FROM":
                    parsed.base = interpolate(rest.split()[0], parsed.args)
                case "USER":
                    parsed.user = rest
                case "HEALTHCHECK":
                    command = rest.partition("CMD")[2].strip()
                    parsed.healthcheck = (
                        json.loads(command) if command.startswith("[") else shlex.split(command)
                    )
                case "ENTRYPOINT":
                    parsed.entrypoint = json.loads(rest) if rest.startswith("[") else rest
                case "ENV":
                    words = shlex.split(rest)
                    if words and "=" not in words[0]:
                        parsed.env[words[0]] = " ".join(words[1:])
                    else:
                        parsed.env.update(word.split("=", 1) for word in words)
                case "COPY":
                    words = [w for w in shlex.split(rest) if not w.startswith("--")]
                    parsed.copies.append((words[:-1], words[-1]))
                case "RUN":
                    parsed.runs.append(rest)
        return parsed


# -- checks -------------------------------------------------------------------------------


def check_kafka(compose: Compose) -> list[str]:
    """A one-node KRaft broker of the launcher's Kafka version, with the launcher's settings."""
    problems = []
    kafka = compose["services"].get(KAFKA_SERVICE)
    if kafka is None:
        return [f"no {KAFKA_SERVICE!r} service"]
    if kafka.get("image") != f"apache/kafka:{KAFKA_VERSION}":
        problems.append(
            f"kafka image {kafka.get('image')} is not apache/kafka:{KAFKA_VERSION}, the version "
            "the tests run against"
        )
    env = environment(kafka)
    node = NodeSpec(1, 19092, 19093)
    expected = dict(
        line.split("=", 1)
        for line in server_properties(node, [node], Path("/data")).splitlines()
        if "=" in line
    )
    for key in ONE_NODE_KEYS:
        name = kafka_env_name(key)
        if env.get(name, "").lower() != expected[key].lower():
            problems.append(f"{name}={env.get(name)!r}, a one-node broker needs {expected[key]!r}")
    try:
        if len(base64.urlsafe_b64decode(env.get("CLUSTER_ID", "") + "==")) != 16:
            problems.append("CLUSTER_ID is not a base64url-encoded 16-byte id")
    except (binascii.Error, ValueError):
        problems.append("CLUSTER_ID is not base64url")
    voters = env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "").split(",")
    declared = listeners(env.get("KAFKA_LISTENERS", "x://:0"))
    controller = env.get("KAFKA_CONTROLLER_LISTENER_NAMES", "")
    if len(voters) != 1 or voters[0].split("@")[0] != env.get("KAFKA_NODE_ID"):
        problems.append(f"the quorum voters {voters} are not this one node")
    elif controller not in declared or not voters[0].endswith(f":{declared[controller][1]}"):
        problems.append(f"the quorum voter {voters[0]} is not the {controller} listener")
    advertised = listeners(env.get("KAFKA_ADVERTISED_LISTENERS", "x://:0"))
    protocols = dict(
        item.split(":") for item in env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "").split(",")
    )
    for name in declared:
        if name not in protocols:
            problems.append(f"listener {name} has no security protocol")
    for name, (_, port) in advertised.items():
        if declared.get(name, ("", -1))[1] != port and not _published_as(kafka, name, port):
            problems.append(f"advertised listener {name} port {port} is not what it listens on")
    if env.get("KAFKA_INTER_BROKER_LISTENER_NAME") not in advertised:
        problems.append("the inter-broker listener is not advertised")
    if "healthcheck" not in kafka:
        problems.append("kafka has no healthcheck for the topics job to wait on")
    return problems


def _published_as(kafka: dict[str, Any], name: str, port: int) -> bool:
    env = environment(kafka)
    declared = listeners(env["KAFKA_LISTENERS"])
    return any(
        m.host_port == port and m.container_port == declared.get(name, ("", -1))[1]
        for m in port_mappings(kafka)
    )


def check_bootstrap(compose: Compose) -> list[str]:
    """Containers bootstrap from an advertised listener named for the kafka service; the host
    one is published on the port it advertises, which is the CLI's default bootstrap."""
    problems = []
    kafka = compose["services"][KAFKA_SERVICE]
    env = environment(kafka)
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    declared = listeners(env["KAFKA_LISTENERS"])
    in_network = {KAFKA_SERVICE, kafka.get("hostname", KAFKA_SERVICE)}
    reachable = {f"{host}:{port}" for host, port in advertised.values() if host in in_network}
    for name, service in flowstream_services(compose).items():
        try:
            args = parse(service["command"])
        except ValueError:
            continue  # check_commands reports it
        if args.bootstrap not in reachable:
            problems.append(
                f"{name} bootstraps from {args.bootstrap}, not an advertised in-network listener "
                f"({', '.join(sorted(reachable))})"
            )
    host_default = Settings.model_fields["bootstrap"].default
    from_host = [
        (name, f"{host}:{port}")
        for name, (host, port) in advertised.items()
        if host in ("127.0.0.1", "localhost")
    ]
    if [address for _, address in from_host] != [host_default]:
        problems.append(f"the host listener is advertised as {from_host}, not {host_default}")
    for name, address in from_host:
        port = int(address.rsplit(":", 1)[1])
        if not any(
            m.host_port == port and m.container_port == declared[name][1]
            for m in port_mappings(kafka)
        ):
            problems.append(f"listener {name} ({address}) is not published on host port {port}")
    return problems


def check_commands(compose: Compose) -> list[str]:
    """One ``topics apply`` job and two ``worker`` services, each accepted by the CLI parser."""
    problems = []
    kinds: dict[str, list[str]] = {"topics": [], "worker": []}
    for name, service in flowstream_services(compose).items():
        command = service.get("command")
        if not isinstance(command, list):
            problems.append(f"{name}: give the command as a list (exec form), not {command!r}")
            continue
        try:
            args = parse([str(word) for word in command])
        except ValueError as error:
            problems.append(f"{name}: the CLI rejects {command}: {error}")
            continue
        if args.command == "topics" and args.action == "apply":
            kinds["topics"].append(name)
        elif args.command == "worker":
            kinds["worker"].append(name)
            try:
                load_runtime(args.app)
            except (ImportError, UsageError) as error:
                problems.append(f"{name}: --app {args.app} does not load: {error}")
        else:
            problems.append(f"{name}: unexpected command {command}")
    if len(kinds["topics"]) != 1:
        problems.append(f"expected one `topics apply` job, found {kinds['topics']}")
    if len(kinds["worker"]) != 2:
        problems.append(f"expected two processors, found {kinds['worker']}")
    return problems


def _parsed(compose: Compose, command: str) -> dict[str, tuple[dict[str, Any], Any]]:
    found = {}
    for name, service in flowstream_services(compose).items():
        with contextlib.suppress(ValueError, TypeError):
            args = parse([str(word) for word in service["command"]])
            if args.command == command:
                found[name] = (service, args)
    return found


def check_topics(compose: Compose) -> list[str]:
    """Everyone uses the topology's prefix; the job fits the replication to one broker."""
    problems = []
    topology = load_topology()
    for name, (service, args) in _parsed(compose, "topics").items():
        if (args.prefix or topology.prefix) != topology.prefix:
            problems.append(f"{name} creates topics under {args.prefix}, not {topology.prefix}")
        if args.replication_factor != 1:
            problems.append(
                f"{name}: --replication-factor {args.replication_factor}; the topology declares "
                f"{topology.topic('events').replication_factor} and this cluster has one broker"
            )
        kafka_condition = (service.get("depends_on") or {}).get(KAFKA_SERVICE, {})
        if kafka_condition.get("condition") != "service_healthy":
            problems.append(f"{name} does not wait for a healthy broker")
    for name, (service, args) in _parsed(compose, "worker").items():
        env = environment(service)
        prefix = args.topic_prefix or env.get(
            "FLOWSTREAM_TOPIC_PREFIX", Settings.model_fields["topic_prefix"].default
        )
        if prefix != topology.prefix:
            problems.append(f"{name} reads topics under {prefix}, not {topology.prefix}")
    return problems


def check_processors(compose: Compose) -> list[str]:
    """Processors: one group, own instance ids and state volumes, published metrics ports."""
    problems = []
    workers = _parsed(compose, "worker")
    if len({args.group for _, args in workers.values()}) != 1:
        problems.append("the processors are not in one consumer group")
    ids = [args.instance_id for _, args in workers.values()]
    if None in ids or len(set(ids)) != len(ids):
        problems.append(f"processor instance ids must be given and distinct: {ids}")
    declared_volumes = set((compose.get("volumes") or {}).keys())
    sources = []
    for name, (service, args) in workers.items():
        state = PurePosixPath(args.state_dir or "")
        mounts = [str(v).split(":") for v in service.get("volumes") or []]
        holding = [m for m in mounts if state.is_relative_to(PurePosixPath(m[1]))]
        if not args.state_dir or not holding:
            problems.append(f"{name}: --state-dir {args.state_dir} is not on a volume")
        for source, *_ in holding:
            sources.append(source)
            if source not in declared_volumes:
                problems.append(f"{name}: volume {source} is not a declared named volume")
        if args.metrics_port is None:
            problems.append(f"{name} serves no metrics")
        elif not any(m.container_port == args.metrics_port for m in port_mappings(service)):
            problems.append(f"{name}: metrics port {args.metrics_port} is not published")
        if (service.get("depends_on") or {}).get("topics", {}).get(
            "condition"
        ) != "service_completed_successfully":
            problems.append(f"{name} does not wait for the topics job to succeed")
        if service.get("restart") not in ("always", "unless-stopped", "on-failure"):
            problems.append(f"{name} is not restarted after it exits (e.g. fenced)")
    if len(set(sources)) != len(sources):
        problems.append(f"processors share a state volume: {sources}")
    host_ports = [
        (m.host_ip, m.host_port) for s in compose["services"].values() for m in port_mappings(s)
    ]
    if len(set(host_ports)) != len(host_ports):
        problems.append(f"host ports collide: {host_ports}")
    return problems


def check_image(compose: Compose, dockerfile: Dockerfile) -> list[str]:
    """Every flowstream service builds docker/Dockerfile from the repository root, which installs
    the package whose console script is the entrypoint and ships the topology it points to."""
    problems = []
    services = flowstream_services(compose)
    for name, service in services.items():
        context = (COMPOSE.parent / service["build"].get("context", ".")).resolve()
        if context != ROOT:
            problems.append(f"{name} builds from {context}, not the repository root")
    if len({service.get("image") for service in services.values()}) != 1:
        problems.append("the flowstream services do not share one image name")
    if dockerfile.base != "python:3.11-slim":
        problems.append(f"the image is based on {dockerfile.base}, not python:3.11-slim")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    if (
        dockerfile.entrypoint != ["flowstream"]
        or scripts.get("flowstream") != "flowstream.cli:main"
    ):
        problems.append(
            f"ENTRYPOINT {dockerfile.entrypoint} is not the console script "
            f"flowstream = {scripts.get('flowstream')}"
        )
    if not any("pip install" in run for run in dockerfile.runs):
        problems.append("the Dockerfile does not pip install the package")
    for sources, _ in dockerfile.copies:
        problems += [
            f"COPY source {s} is not in the repository" for s in sources if not (ROOT / s).exists()
        ]
    topology = dockerfile.env.get("FLOWSTREAM_TOPOLOGY")
    # COPY of a directory copies its contents into the destination.
    shipped = [
        PurePosixPath(dest)
        for sources, dest in dockerfile.copies
        if "topology" in [source.rstrip("/") for source in sources]
    ]
    if topology is None or not any(
        PurePosixPath(topology) == target / "topics.toml" for target in shipped
    ):
        problems.append(
            f"FLOWSTREAM_TOPOLOGY={topology} is not the topics.toml copied from topology/ "
            f"(copied to {[str(t) for t in shipped]}); an installed package cannot find it"
        )
    return problems


def _serves_every_interface(host: str) -> bool:
    return host in ("0.0.0.0", "::")


def check_health(compose: Compose, dockerfile: Dockerfile) -> list[str]:
    """Processors bind their metrics server where the published port reaches it (not the
    container's loopback), on the port the image's healthcheck asks; the image runs as a user
    and has a healthcheck, whose script it ships."""
    problems = []
    image_port = dockerfile.env.get("FLOWSTREAM_METRICS_PORT")
    image_host = dockerfile.env.get("FLOWSTREAM_METRICS_HOST", Settings().metrics_host)
    for name, (_, args) in _parsed(compose, "worker").items():
        host = args.metrics_host or image_host
        if not _serves_every_interface(host):
            problems.append(
                f"{name} binds its metrics to {host}: a published port cannot reach it there"
            )
        port = args.metrics_port or image_port
        if str(port) != image_port:
            problems.append(
                f"{name} serves metrics on {port}, the healthcheck asks "
                f"FLOWSTREAM_METRICS_PORT={image_port}"
            )
    if dockerfile.user in ("", "root", "0") or dockerfile.user.startswith("0:"):
        problems.append(f"the image runs as {dockerfile.user!r}, not as a user of its own")
    scripts = [word for word in dockerfile.healthcheck if word.endswith(".py")]
    if not dockerfile.healthcheck:
        problems.append("the image has no HEALTHCHECK")
    for script in scripts:
        shipped = [src for srcs, dest in dockerfile.copies for src in srcs if dest == script]
        if not shipped or not (ROOT / shipped[0]).is_file():
            problems.append(f"the healthcheck runs {script}, which the image does not copy in")
        elif "/healthz" not in (ROOT / shipped[0]).read_text():
            problems.append(f"the healthcheck {shipped[0]} does not ask /healthz")
    return problems


def check_pins(requirements: str, dockerfile: Dockerfile) -> list[str]:
    """The image installs requirements.txt alone (``--no-deps``, then ``pip check``), which pins
    every dependency and build requirement of pyproject.toml to one version it allows."""
    problems = []
    pins: dict[str, str] = {}
    for line in requirements.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==":
            problems.append(f"{line} is not pinned to one version")
            continue
        pins[requirement.name.lower().replace("_", "-")] = specifiers[0].version
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    for text in wanted:
        requirement = Requirement(text)
        pin = pins.get(requirement.name.lower().replace("_", "-"))
        if pin is None:
            problems.append(f"{requirement.name} is not pinned in docker/requirements.txt")
        elif not requirement.specifier.contains(pin, prereleases=True):
            problems.append(f"{requirement.name}=={pin} is not allowed by {text!r}")
    installs = [run for run in dockerfile.runs if "pip install" in run]
    if not installs or not all("--no-deps" in run for run in installs):
        problems.append("the Dockerfile installs packages without --no-deps (unpinned ones)")
    if not any("-r /opt/flowstream/requirements.txt" in run for run in installs):
        problems.append("the Dockerfile does not install docker/requirements.txt")
    if not any("pip check" in run for run in dockerfile.runs):
        problems.append("the Dockerfile does not run `pip check`")
    return problems


# -- tests --------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[Compose, Dockerfile], list[str]]] = {
    "kafka": lambda c, _: check_kafka(c),
    "bootstrap": lambda c, _: check_bootstrap(c),
    "commands": lambda c, _: check_commands(c),
    "topics": lambda c, _: check_topics(c),
    "processors": lambda c, _: check_processors(c),
    "image": check_image,
    "health": check_health,
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_shipped_files_pass(check: str) -> None:
    assert CHECKS[check](load_compose(), Dockerfile.parse(DOCKERFILE.read_text())) == []


def _command(compose: Compose, service: str) -> list[str]:
    command: list[str] = compose["services"][service]["command"]
    return command


def _replace(words: list[str], option: str, value: str) -> None:
    words[words.index(option) + 1] = value


Mutation = Callable[[Compose, Dockerfile], None]

BROKEN: list[tuple[str, str, Mutation, str]] = [
    (
        "kafka",
        "transaction log replicated 3 times on one broker",
        lambda c, _: c["services"]["kafka"]["environment"].update(
            KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR=3
        ),
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
    ),
    (
        "kafka",
        "auto topic creation on",
        lambda c, _: c["services"]["kafka"]["environment"].update(
            KAFKA_AUTO_CREATE_TOPICS_ENABLE="true"
        ),
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE",
    ),
    (
        "kafka",
        "the broker's default floor for session timeouts",
        lambda c, _: c["services"]["kafka"]["environment"].pop(
            "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"
        ),
        "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS",
    ),
    (
        "kafka",
        "another Kafka version",
        lambda c, _: c["services"]["kafka"].update(image="apache/kafka:3.7.0"),
        "the version the tests run against",
    ),
    (
        "kafka",
        "a cluster id Kafka cannot format",
        lambda c, _: c["services"]["kafka"]["environment"].update(CLUSTER_ID="flowstream-1"),
        "CLUSTER_ID",
    ),
    (
        "bootstrap",
        "a processor bootstraps from the controller port",
        lambda c, _: _replace(_command(c, "processor-2"), "--bootstrap", "kafka:9093"),
        "processor-2 bootstraps from kafka:9093",
    ),
    (
        "bootstrap",
        "the host listener is not published",
        lambda c, _: c["services"]["kafka"].update(ports=[]),
        "is not published",
    ),
    (
        "commands",
        "a worker option the CLI does not have",
        lambda c, _: _command(c, "processor-1").extend(["--threads", "4"]),
        "unrecognized arguments: --threads 4",
    ),
    (
        "commands",
        "a runtime that does not exist",
        lambda c, _: _replace(_command(c, "processor-1"), "--app", "flowstream.examples.nope:x"),
        "does not load",
    ),
    (
        "commands",
        "only one processor",
        lambda c, _: c["services"].pop("processor-2"),
        "expected two processors",
    ),
    (
        "topics",
        "a processor reads another prefix",
        lambda c, _: _replace(_command(c, "processor-1"), "--prefix", "elsewhere"),
        "processor-1 reads topics under elsewhere",
    ),
    (
        "topics",
        "the declared replication on one broker",
        lambda c, _: _replace(_command(c, "topics"), "--replication-factor", "3"),
        "--replication-factor 3",
    ),
    (
        "processors",
        "two processors with one instance id",
        lambda c, _: _replace(_command(c, "processor-2"), "--instance-id", "processor-1"),
        "distinct",
    ),
    (
        "processors",
        "two processors on one state volume",
        lambda c, _: c["services"]["processor-2"].update(
            volumes=["processor-1-state:/var/lib/flowstream"]
        ),
        "share a state volume",
    ),
    (
        "processors",
        "metrics served on an unpublished port",
        lambda c, _: _replace(_command(c, "processor-1"), "--metrics-port", "9999"),
        "metrics port 9999 is not published",
    ),
    (
        "processors",
        "state outside the volume",
        lambda c, _: _replace(_command(c, "processor-1"), "--state-dir", "/tmp/state"),
        "is not on a volume",
    ),
    (
        "health",
        "metrics bound to the container's loopback",
        lambda c, _: _replace(_command(c, "processor-1"), "--metrics-host", "127.0.0.1"),
        "processor-1 binds its metrics to 127.0.0.1",
    ),
    (
        "health",
        "no metrics host at all (the setting's default, loopback)",
        lambda c, d: (
            _command(c, "processor-2").remove("--metrics-host"),
            _command(c, "processor-2").remove("0.0.0.0"),
            d.env.pop("FLOWSTREAM_METRICS_HOST"),
        ),
        "processor-2 binds its metrics to 127.0.0.1",
    ),
    (
        "health",
        "metrics on another port than the healthcheck asks",
        lambda c, _: (
            _replace(_command(c, "processor-2"), "--metrics-port", "9999"),
            c["services"]["processor-2"].update(ports=["127.0.0.1:9465:9999"]),
        ),
        "the healthcheck asks FLOWSTREAM_METRICS_PORT=9464",
    ),
    (
        "health",
        "the image runs as root",
        lambda _, d: setattr(d, "user", "root"),
        "not as a user of its own",
    ),
    (
        "health",
        "no healthcheck",
        lambda _, d: setattr(d, "healthcheck", []),
        "no HEALTHCHECK",
    ),
    (
        "health",
        "a healthcheck script that is not copied in",
        lambda _, d: setattr(d, "healthcheck", ["python3", "/opt/elsewhere/check.py"]),
        "which the image does not copy in",
    ),
    (
        "image",
        "an entrypoint that is not the console script",
        lambda _, d: setattr(d, "entrypoint", ["python", "-m", "flowstream"]),
        "is not the console script",
    ),
    (
        "image",
        "no FLOWSTREAM_TOPOLOGY",
        lambda _, d: d.env.pop("FLOWSTREAM_TOPOLOGY"),
        "an installed package cannot find it",
    ),
    (
        "image",
        "another base image",
        lambda _, d: setattr(d, "base", "python:3.12"),
        "not python:3.11-slim",
    ),
]


@pytest.mark.parametrize(
    ("check", "mutation", "expected"),
    [
        pytest.param(check, mutate, expected, id=f"{check}: {what}")
        for check, what, mutate, expected in BROKEN
    ],
)
def test_each_check_finds_a_broken_copy(check: str, mutation: Mutation, expected: str) -> None:
    compose = copy.deepcopy(load_compose())
    dockerfile = Dockerfile.parse(DOCKERFILE.read_text())
    mutation(compose, dockerfile)
    problems = CHECKS[check](compose, dockerfile)
    assert any(expected in problem for problem in problems), problems


def test_the_dockerfile_parser_reads_continuations_and_env_forms() -> None:
    parsed = Dockerfile.parse(
        "# comment\nFROM python:3.11-slim AS base\nENV A=1 \\\n    B=two\nENV C three words\n"
        'COPY --chown=x a b /dest/\nENTRYPOINT ["flowstream"]\n'
    )
    assert parsed.base == "python:3.11-slim"
    assert parsed.env == {"A": "1", "B": "two", "C": "three words"}
    assert parsed.copies == [(["a", "b"], "/dest/")]
    assert parsed.entrypoint == ["flowstream"]


def test_the_build_context_ships_what_the_dockerfile_copies() -> None:
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert ignore[ignore.index("*") if "*" in ignore else 0] == "*"
    for sources, _ in Dockerfile.parse(DOCKERFILE.read_text()).copies:
        for source in sources:
            assert source.rstrip("/") in allowed, f"{source} is excluded from the build context"


def test_the_requirements_pin_what_the_image_installs() -> None:
    assert check_pins(REQUIREMENTS.read_text(), Dockerfile.parse(DOCKERFILE.read_text())) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r, d: (r.replace("pydantic==2.14.4", "pydantic>=2.6"), d), "is not pinned"),
        (lambda r, d: (r.replace("orjson==3.13.0\n", ""), d), "orjson is not pinned"),
        (lambda r, d: (r.replace("pydantic==2.14.4", "pydantic==3.0.0"), d), "is not allowed"),
        (lambda r, d: (r.replace("setuptools==84.2.1\n", ""), d), "setuptools is not pinned"),
        (
            lambda r, d: (r, setattr(d, "runs", [x.replace("--no-deps", "") for x in d.runs])),
            "without --no-deps",
        ),
        (
            lambda r, d: (r, setattr(d, "runs", [x.replace("pip check", "true") for x in d.runs])),
            "pip check",
        ),
    ],
    ids=[
        "a range",
        "a dependency left out",
        "a version pyproject refuses",
        "the build backend",
        "dependencies resolved at build time",
        "no pip check",
    ],
)
def test_the_pins_check_finds_a_broken_copy(
    edit: Callable[[str, Dockerfile], tuple[str, object]], expected: str
) -> None:
    dockerfile = Dockerfile.parse(DOCKERFILE.read_text())
    requirements, _ = edit(REQUIREMENTS.read_text(), dockerfile)
    problems = check_pins(requirements, dockerfile)
    assert any(expected in problem for problem in problems), problems


def test_the_compose_variables_default_to_the_documented_deployment() -> None:
    """Unset, the variables give apache/kafka and the CLI's default ports; set, as docker/test.sh
    sets them, the advertised host listener follows the published port."""
    kafka = load_compose()["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    chosen = {"FLOWSTREAM_KAFKA_IMAGE": "flowstream-kafka:x", "FLOWSTREAM_KAFKA_HOST_PORT": "19851"}
    compose = load_compose(chosen)
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == "flowstream-kafka:x"
    advertised = listeners(environment(kafka)["KAFKA_ADVERTISED_LISTENERS"])
    assert advertised["EXTERNAL"] == ("127.0.0.1", 19851)
    assert PortMapping("127.0.0.1", 19851, 19092) in port_mappings(kafka)
    assert any("flowstream-kafka:x is not apache/kafka" in p for p in check_kafka(compose))
    # The variables are not settings: a FLOWSTREAM_<FIELD> of the shell never reaches compose.
    names = {m.group(1) for m in _VARIABLE.finditer(COMPOSE.read_text())}
    assert names == {
        "FLOWSTREAM_IMAGE",
        "FLOWSTREAM_KAFKA_IMAGE",
        "FLOWSTREAM_KAFKA_HOST_PORT",
        "FLOWSTREAM_METRICS_HOST_PORT_1",
        "FLOWSTREAM_METRICS_HOST_PORT_2",
    }
    assert not {n.removeprefix("FLOWSTREAM_").lower() for n in names} & set(Settings.model_fields)
