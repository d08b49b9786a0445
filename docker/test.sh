#!/usr/bin/env bash
# Builds docker/ for real and drives the compose deployment from the host (docker/README.md,
# "The test"). Pulls no image: the base is made from Debian's packages with debootstrap, the
# Kafka image from the jars `flowstream dev-kafka` runs. Exits non-zero on any failure.
#
#  1. installs docker.io, docker-compose and debootstrap with apt when they are absent;
#  2. uses the Docker engine of DOCKER_HOST (or /var/run/docker.sock) when one answers, else
#     starts its own dockerd (--iptables=false --bridge=none, no IP forwarding: the machine's
#     network settings stay as they are), stopped by its PID at the end;
#  3. builds the base images (once: they stay in the engine), the flowstream image from
#     docker/Dockerfile and the Kafka image from docker/kafka-image/Dockerfile;
#  4. starts docker/compose.yaml as project $FLOWSTREAM_DOCKER_PROJECT, and drives it from the
#     host with docker/drive.py (runs, signals, hooks, /metrics, /healthz, a processor killed);
#  5. removes the project's containers, network and volumes, and stops the dockerd it started.
#
# Environment (all optional):
#   FLOWSTREAM_DOCKER_PYTHON       the host's Python with flowstream's dependencies (.venv/bin/python)
#   FLOWSTREAM_DOCKER_CACHE        the data root of the dockerd it starts, kept between runs so the
#                                  images are built once per machine (~/.cache/flowstream/docker)
#   FLOWSTREAM_DOCKER_RUN          that dockerd's socket, pid file and state (a new temporary dir)
#   FLOWSTREAM_DOCKER_PROJECT      the compose project name (flowstream-test)
#   FLOWSTREAM_KAFKA_HOST_PORT, FLOWSTREAM_METRICS_HOST_PORT_1, FLOWSTREAM_METRICS_HOST_PORT_2
#                                  the host ports published on 127.0.0.1 (19851, 19852, 19853)
#   FLOWSTREAM_DOCKER_WHEELS_PORT  the loopback port the wheelhouse is served on during a build (19854)
#   FLOWSTREAM_DEBIAN_MIRROR       where debootstrap and apt in the images fetch Debian packages
#   FLOWSTREAM_DOCKER_RUNS         runs per batch of the scenario (8)
set -euo pipefail

started=$(date +%s)
cd "$(dirname "$0")/.."
root=$PWD
python=${FLOWSTREAM_DOCKER_PYTHON:-$root/.venv/bin/python}
project=${FLOWSTREAM_DOCKER_PROJECT:-flowstream-test}
cache=${FLOWSTREAM_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flowstream/docker}
suite=bookworm
mirror=${FLOWSTREAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
export FLOWSTREAM_KAFKA_HOST_PORT=${FLOWSTREAM_KAFKA_HOST_PORT:-19851}
export FLOWSTREAM_METRICS_HOST_PORT_1=${FLOWSTREAM_METRICS_HOST_PORT_1:-19852}
export FLOWSTREAM_METRICS_HOST_PORT_2=${FLOWSTREAM_METRICS_HOST_PORT_2:-19853}
wheels_port=${FLOWSTREAM_DOCKER_WHEELS_PORT:-19854}
export FLOWSTREAM_IMAGE=flowstream:test
# The legacy builder: no buildx plugin needed, and the contexts below are staged by hand.
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

say() { echo "docker-test: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
step_started=$started
step() {
    local now
    now=$(date +%s)
    say "$1 ($((now - step_started)) s; $((now - started)) s in all)"
    step_started=$now
}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

[ -x "$python" ] || fail "no Python at $python: make .venv (pip install -e .) or set FLOWSTREAM_DOCKER_PYTHON"
# Host-side Python runs this checkout's flowstream.
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}

# -- 1. packages ----------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} with apt"
    # Installing docker.io must not start a system dockerd: the policy says no to every service.
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
        as_root chmod +x /usr/sbin/policy-rc.d
        made_policy=1
    fi
    as_root apt-get update -q >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null
    [ -z "$made_policy" ] || as_root rm -f /usr/sbin/policy-rc.d
    step "installed ${missing[*]}"
fi

# -- 2. the engine --------------------------------------------------------------------------
mkdir -p "$cache"
exec 9>"$cache/lock"
flock -w 900 9 || fail "another docker/test.sh holds $cache/lock"
dockerd_pid=
wheels_pid=
run_dir=
work=
compose_up=
compose=(docker-compose -p "$project" -f docker/compose.yaml)

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    [ -z "$wheels_pid" ] || kill "$wheels_pid" 2>/dev/null || true
    if [ -n "$compose_up" ]; then
        if [ "$status" -ne 0 ]; then
            "${compose[@]}" ps >&2 || true
            "${compose[@]}" logs --no-color --tail=60 >&2 || true
        fi
        "${compose[@]}" down -v --remove-orphans -t 10 >/dev/null 2>&1 ||
            say "compose down failed"
    fi
    if [ -n "$dockerd_pid" ]; then
        as_root kill -TERM "$dockerd_pid" 2>/dev/null || true
        for _ in $(seq 1 60); do
            kill -0 "$dockerd_pid" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$dockerd_pid" 2>/dev/null; then
            say "dockerd $dockerd_pid did not stop in 30 s: killing it"
            as_root kill -KILL "$dockerd_pid" 2>/dev/null || true
        fi
        [ "$status" -eq 0 ] || tail -n 20 "$run_dir/dockerd.log" >&2 || true
        say "stopped dockerd $dockerd_pid"
        # dockerd leaves its network namespace mounted (exec/netns/default) when it stops.
        while read -r _ mount _; do
            case $mount in "$run_dir"/*) as_root umount "$mount" || true ;; esac
        done </proc/mounts
        [ -n "${FLOWSTREAM_DOCKER_RUN:-}" ] || as_root rm -rf "$run_dir"
    fi
    [ -z "$work" ] || as_root rm -rf "$work"
    say "exit status $status, wall time $(($(date +%s) - started)) s"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

engine_answers() { timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if [ -z "${DOCKER_HOST:-}" ] && [ -S /var/run/docker.sock ]; then
    export DOCKER_HOST=unix:///var/run/docker.sock
fi
if [ -n "${DOCKER_HOST:-}" ] && engine_answers; then
    say "using the Docker engine at $DOCKER_HOST"
else
    # A dockerd an interrupted run of this script left on the cache: stop it (its pid file is
    # ours, and names it).
    if [ -s "$cache/dockerd.pid" ]; then
        stale=$(cat "$cache/dockerd.pid")
        if tr '\0' ' ' <"/proc/$stale/cmdline" 2>/dev/null | grep -q -- "--pidfile $cache/dockerd.pid"; then
            say "stopping dockerd $stale, left by an earlier run"
            as_root kill -TERM "$stale" || true
            for _ in $(seq 1 60); do kill -0 "$stale" 2>/dev/null || break; sleep 0.5; done
        fi
    fi
    run_dir=${FLOWSTREAM_DOCKER_RUN:-$(mktemp -d "${TMPDIR:-/tmp}/flowstream-dockerd.XXXXXX")}
    mkdir -p "$run_dir" "$cache/data"
    # Not through as_root, a function: backgrounded, it would be a subshell whose PID is not
    # dockerd's. (Under sudo, the PID is sudo's, which passes the signal on.) In a session of its
    # own, so a signal to this script's process group (timeout, ^C) leaves it to the cleanup,
    # which takes the deployment down first. fd 9, the lock, stays with this script.
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
    "${sudo[@]}" setsid dockerd \
        --data-root "$cache/data" \
        --exec-root "$run_dir/exec" \
        --pidfile "$cache/dockerd.pid" \
        --host "unix://$run_dir/docker.sock" \
        --iptables=false --bridge=none --ip-forward=false --ip-masq=false \
        >"$run_dir/dockerd.log" 2>&1 9>&- &
    dockerd_pid=$!
    export DOCKER_HOST=unix://$run_dir/docker.sock
    for _ in $(seq 1 120); do
        engine_answers && break
        kill -0 "$dockerd_pid" 2>/dev/null || { tail -n 20 "$run_dir/dockerd.log" >&2; fail "dockerd exited"; }
        sleep 0.5
    done
    engine_answers || fail "dockerd did not answer within 60 s"
    step "started dockerd $dockerd_pid ($(docker info --format '{{.Driver}}') storage, data root $cache/data)"
fi

# -- 3. images ------------------------------------------------------------------------------
kafka_version=$("$python" -c 'from flowstream.devkafka.jars import KAFKA_VERSION; print(KAFKA_VERSION)')
export FLOWSTREAM_KAFKA_IMAGE=flowstream-kafka:$kafka_version
debian=flowstream-debian:$suite
python_base=flowstream-python:$suite
work=$(mktemp -d "${TMPDIR:-/tmp}/flowstream-docker-test.XXXXXX")
quiet_build() {
    # docker build, its output kept unless it fails.
    local log=$work/build.log
    if ! docker build --network host "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        fail "docker build $*"
    fi
}

if ! docker image inspect "$debian" >/dev/null 2>&1; then
    rootfs=$work/rootfs
    say "making $debian with debootstrap from $mirror"
    as_root debootstrap --variant=minbase --include=passwd "$suite" "$rootfs" "$mirror" \
        >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; fail debootstrap; }
    # As Debian's slim images do: no documentation, manual pages or translations, now or in the
    # packages the images install later.
    # (The copyright files stay; so does man1, which openjdk's postinst links into.)
    as_root sh -c "cd '$rootfs' && rm -rf var/cache/apt/archives/*.deb var/lib/apt/lists/* \
        usr/share/man/* usr/share/info/* usr/share/locale/* usr/share/lintian/* &&
        find usr/share/doc -type f ! -name copyright -delete && mkdir -p usr/share/man/man1"
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/locale/*' 'path-exclude /usr/share/lintian/*' |
        as_root tee "$rootfs/etc/dpkg/dpkg.cfg.d/flowstream-slim" >/dev/null
    as_root tar -C "$rootfs" -c . | docker import --change 'CMD ["/bin/bash"]' - "$debian" >/dev/null
    as_root rm -rf "$rootfs"
    step "made $debian"
fi
# The stand-in for python:3.11-slim: Debian's Python 3.11 and its venv module.
quiet_build -t "$python_base" - <<EOF
FROM $debian
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
EOF
step "built $python_base"

# pip in the build installs the pinned wheels from the host: the host's pip fetches them from
# PyPI (with the host's certificate authorities, which an egress proxy may need) into a
# wheelhouse kept in the cache, served on loopback while the image builds.
wheels=$cache/wheels
platforms=()
for glibc in 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 20 19 18 17; do
    platforms+=(--platform "manylinux_2_${glibc}_$(uname -m)")  # Debian 12 has glibc 2.36
done
have_wheels=1
while read -r pin; do
    pin=${pin%%#*}
    pin=${pin// /}
    [ -n "$pin" ] || continue
    name=${pin%%==*}
    compgen -G "$wheels/${name//-/_}-${pin##*==}-*.whl" >/dev/null || have_wheels=
done <docker/requirements.txt
if [ -z "$have_wheels" ]; then
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --implementation cp --python-version 3.11 --abi cp311 "${platforms[@]}" \
        --dest "$wheels" -r docker/requirements.txt || fail "pip download of docker/requirements.txt"
fi
"$python" -m http.server --bind 127.0.0.1 --directory "$wheels" "$wheels_port" \
    >"$work/wheels.log" 2>&1 9>&- &
wheels_pid=$!
"$python" - "http://127.0.0.1:$wheels_port/" <<'EOF' || fail "the wheelhouse is not served"
import sys, time, urllib.request
for _ in range(50):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=1)
        break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit(1)
EOF
# The build context docker/Dockerfile.dockerignore describes, staged (the legacy builder reads
# only a .dockerignore at the root).
tar -c --exclude=__pycache__ --exclude='*.pyc' \
    pyproject.toml flowstream topology docker/Dockerfile docker/requirements.txt docker/healthcheck.py |
    quiet_build -f docker/Dockerfile --build-arg BASE_IMAGE="$python_base" \
        --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS="http://127.0.0.1:$wheels_port/" \
        -t "$FLOWSTREAM_IMAGE" -
kill "$wheels_pid" && wait "$wheels_pid" 2>/dev/null || true
wheels_pid=
step "built $FLOWSTREAM_IMAGE"

mkdir "$work/kafka"
"$python" docker/drive.py kafka-context "$work/kafka"
quiet_build --build-arg BASE_IMAGE="$debian" -t "$FLOWSTREAM_KAFKA_IMAGE" "$work/kafka"
step "built $FLOWSTREAM_KAFKA_IMAGE"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' |
    grep -E "^($debian|$python_base|$FLOWSTREAM_IMAGE|$FLOWSTREAM_KAFKA_IMAGE) " |
    sed 's/^/docker-test: image size: /' >&2

# -- 4. the deployment ----------------------------------------------------------------------
"${compose[@]}" down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
deployed_at=$(date +%s.%N)
compose_up=1
"${compose[@]}" up -d --no-build >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "compose up"; }
step "compose up: kafka healthy, topics applied, processors started"
processor_1=$("${compose[@]}" ps -q processor-1)
[ -n "$processor_1" ] || fail "no processor-1 container"

figures=$("$python" docker/drive.py run \
    --bootstrap "127.0.0.1:$FLOWSTREAM_KAFKA_HOST_PORT" \
    --metrics-1 "127.0.0.1:$FLOWSTREAM_METRICS_HOST_PORT_1" \
    --metrics-2 "127.0.0.1:$FLOWSTREAM_METRICS_HOST_PORT_2" \
    --kill "$processor_1" \
    --runs "${FLOWSTREAM_DOCKER_RUNS:-8}" \
    --deployed-at "$deployed_at")
step "drove the deployment"
# Docker runs the image's healthcheck every 10 s; until one passes the status is "starting"
# (the first may have met processor-2 taking processor-1's partitions over): wait for a pass.
processor_2=$("${compose[@]}" ps -q processor-2)
for _ in $(seq 45); do
    health=$(docker inspect --format '{{.State.Health.Status}}' "$processor_2")
    [ "$health" = starting ] || break
    sleep 1
done
if [ "$health" != healthy ]; then
    docker inspect --format '{{range .State.Health.Log}}{{.Output}}{{end}}' "$processor_2" >&2
    fail "processor-2's healthcheck says $health"
fi
say "processor-2's Docker healthcheck: $health"
say "figures: $figures"
