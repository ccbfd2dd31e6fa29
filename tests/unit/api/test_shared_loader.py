"""A loader's future is shared by every field that asks for its key: cancelling one of them
(graphql-core cancels the siblings of a failed non-null field) leaves the others their answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agent_engine.api.loaders import SharedLoader

ANSWER_TIMEOUT_SECONDS = 5.0


class _Table:
    """A load function over a dict that answers when told to, counting its batches."""

    def __init__(self, rows: dict[int, str]) -> None:
        self.rows = rows
        self.batches: list[list[int]] = []
        self.answer = asyncio.Event()

    async def load(self, keys: Sequence[int]) -> list[str | None]:
        self.batches.append(list(keys))
        await self.answer.wait()
        return [self.rows.get(key) for key in keys]


async def test_a_cancelled_consumer_leaves_the_other_consumers_of_the_key_their_row() -> None:
    table = _Table({1: "one", 2: "two"})
    loader: SharedLoader[int, str | None] = SharedLoader(load_fn=table.load)

    async def consumer(key: int) -> str | None:
        return await loader.load(key)

    doomed = asyncio.ensure_future(consumer(1))
    kept = asyncio.ensure_future(consumer(1))
    other = asyncio.ensure_future(consumer(2))
    await asyncio.sleep(0)  # all three wait on the batch
    doomed.cancel()
    await asyncio.sleep(0)
    table.answer.set()

    async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
        assert await kept == "one"
    assert await other == "two"
    assert doomed.cancelled()
    # A later field asking for the key gets the cached row, not a cancelled future.
    assert await loader.load(1) == "one"
    assert table.batches == [[1, 2]]


async def test_a_batch_whose_only_consumer_was_cancelled_still_answers_the_next_one() -> None:
    table = _Table({7: "seven"})
    loader: SharedLoader[int, str | None] = SharedLoader(load_fn=table.load)

    async def consumer() -> str | None:
        return await loader.load(7)

    first = asyncio.ensure_future(consumer())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    table.answer.set()
    async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
        assert await loader.load(7) == "seven"
