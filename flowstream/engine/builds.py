"""``RuntimeBuilds``: which pinned runs an engine may replay."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RuntimeBuilds"]


@dataclass(frozen=True, slots=True)
class RuntimeBuilds:
    """Which pinned runs this engine may replay.

    With no ``current`` build the engine serves only unpinned runs. With one, it serves that
    build and the ``compatible`` ones, and unpinned runs only when ``accept_unpinned``.
    """

    current: str | None = None
    compatible: frozenset[str] = frozenset()
    accept_unpinned: bool = False

    def admits(self, build_id: str | None) -> bool:
        if build_id is None:
            return self.current is None or self.accept_unpinned
        return build_id == self.current or build_id in self.compatible
