"""Reading an upstream's answer ahead of a slow client, bounded.

The proxy reads a streamed answer from the upstream in one task and writes it to the client in
another, with a :class:`Pipe` between them: a client that reads slowly, or stopped reading,
then no longer holds the upstream back. The upstream finishes its work (and the guard's slot
for it is freed for the next request) while the rest of the answer waits in the pipe for the
client, who has ``limits.connections.send_timeout_s`` to take more of it.

What waits is bounded twice: by ``read_ahead_bytes`` per answer and by ``read_ahead_total_bytes``
for all answers of the process together (:class:`ReadAheadBudget`). Past either, the reader
waits for the writer as it did without a pipe, so a flood of unread answers costs at most the
total; a pipe always takes one chunk, so the reader of an empty pipe never waits on others.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Pipe", "ReadAheadBudget"]


class ReadAheadBudget:
    """The bytes all pipes of a process may hold together."""

    __slots__ = ("total", "used")

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0


class Pipe:
    """Bytes from one reader to one writer, at most ``limit`` waiting (and the budget's)."""

    __slots__ = ("_budget", "_chunks", "_closed", "_error", "_limit", "_readable", "_size",
                 "_writable")  # fmt: skip

    def __init__(self, limit: int, budget: ReadAheadBudget) -> None:
        self._limit = limit
        self._budget = budget
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._closed = False
        self._error: BaseException | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()

    @property
    def size(self) -> int:
        return self._size

    def _full(self, more: int) -> bool:
        budget = self._budget
        return self._size > 0 and (
            self._size + more > self._limit or budget.used + more > budget.total
        )

    async def put(self, data: bytes) -> None:
        """Add ``data``; waits while the pipe (or the budget) is full and not empty."""
        while self._full(len(data)):
            self._writable.clear()
            await self._writable.wait()
        self._chunks.append(data)
        self._size += len(data)
        self._budget.used += len(data)
        self._readable.set()

    def close(self, error: BaseException | None = None) -> None:
        """Nothing more comes; ``error``: the reader failed (raised to the writer)."""
        self._closed = True
        self._error = error
        self._readable.set()

    async def get(self) -> bytes | None:
        """All the bytes waiting (at least one), or None once closed and empty."""
        while not self._chunks:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return None
            self._readable.clear()
            await self._readable.wait()
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._budget.used -= self._size
        self._size = 0
        self._writable.set()
        return data

    def discard(self) -> None:
        """Give back what waits (the writer is gone)."""
        self._chunks.clear()
        self._budget.used -= self._size
        self._size = 0
        self._writable.set()
