"""The flowstream image's HEALTHCHECK: exit 0 when the worker's ``/healthz`` answers 200.

It asks the port the worker serves (``FLOWSTREAM_METRICS_PORT``), on loopback when the worker
binds every interface (``FLOWSTREAM_METRICS_HOST`` ``0.0.0.0`` or ``::``); the report's problems
are printed, so ``docker inspect`` shows why a container is unhealthy.
"""

import json
import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("FLOWSTREAM_METRICS_PORT")
    if not port:
        print("FLOWSTREAM_METRICS_PORT is not set: this container serves no /healthz")
        return 1
    host = os.environ.get("FLOWSTREAM_METRICS_HOST", "127.0.0.1")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=4) as answer:
            print(answer.read().decode())
            return 0
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        try:
            print("; ".join(json.loads(body)["problems"]))
        except (ValueError, KeyError, TypeError):
            print(f"HTTP {error.code}: {body[:200]}")
    except OSError as error:
        print(f"no answer on {host}:{port}: {error}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
