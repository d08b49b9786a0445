"""``maybe_await``: user code may return a value or an awaitable, and is awaited only then.

The check is remembered per type (it is what makes a plain value cheap), so these calls repeat
each case: a type met once as not awaitable must not hide an awaitable of another type, and a
generator, which may or may not be a ``types.coroutine``, is never remembered.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Generator
from typing import Any

from flowstream.engine.cycle import maybe_await


async def _five() -> int:
    return 5


class _Awaitable:
    def __await__(self) -> Generator[Any, None, int]:
        return _five().__await__()


class _Plain:
    pass


@types.coroutine
def _old_style() -> Generator[Any, None, int]:
    yield from asyncio.sleep(0).__await__()
    return 7


def _generator() -> Generator[int, None, None]:
    yield 1


def test_values_are_returned_and_awaitables_awaited_each_time() -> None:
    async def calls() -> None:
        for _ in range(3):
            assert await maybe_await(None) is None
            assert await maybe_await({"a": [1]}) == {"a": [1]}
            plain = _Plain()
            assert await maybe_await(plain) is plain
            assert await maybe_await(_five()) == 5
            assert await maybe_await(_Awaitable()) == 5
            generator = _generator()
            assert await maybe_await(generator) is generator
            assert await maybe_await(_old_style()) == 7

    asyncio.run(calls())
