"""Packaging beyond pyproject.toml: the wheel carries the deployment's topology.

``topology/topics.toml`` stays where operators and the container image find it, and a built
package gets a copy as ``flowstream/topics.toml`` (what :func:`flowstream.topology.
default_topology_path` reads when no ``FLOWSTREAM_TOPOLOGY`` is set and no source tree is beside
the package), so a plain ``pip install`` can run the Kafka commands.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TOPOLOGY = Path(__file__).resolve().parent / "topology" / "topics.toml"


class BuildWithTopology(build_py):
    def run(self) -> None:
        super().run()
        if TOPOLOGY.is_file():  # a tree copied without topology/ builds without it
            target = Path(self.build_lib) / "flowstream" / "topics.toml"
            # An editable install builds into an empty directory (the package stays in the
            # source tree, beside topology/): the copy needs its folder made.
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(TOPOLOGY), str(target))


setup(cmdclass={"build_py": BuildWithTopology})
