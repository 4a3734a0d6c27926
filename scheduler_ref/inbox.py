"""The bounded inbox between API handlers and the core loop.

An :class:`Instruction` carries an op (``add``/``abort``), the request ids it depends on and a
timeout (its SLA: how long it may wait here before it is dropped as stale).

- ``add`` instructions are bounded by ``capacity``. :meth:`Inbox.put` enqueues without
  blocking while there is room; when the inbox is full it waits up to the dispatch timeout
  (500 ms by default) for a slot, then fails with :class:`~guard.errors.Overloaded`
  ``queue_full`` ("instruction queue full"). :meth:`Inbox.put_nowait` fails at once.
- ``abort`` instructions are never refused and never expire (dropping an abort would leak the
  request's blocks). An abort whose ``add`` is still here cancels it on the spot, freeing the
  slot, and is not queued at all. Otherwise it goes to a separate lane, only if its id is
  pending in the scheduler, deduplicated by id: the lane holds at most one entry per request
  the scheduler holds, so it is bounded by the work it cancels.
- Dependencies: an ``add`` is released only once every id it depends on is no longer pending
  (here or in the scheduler). Only ids pending when the instruction is put are kept, so every
  dependency points to an earlier instruction: the graph is acyclic and nothing deadlocks.

The inbox is synchronous apart from :meth:`Inbox.put` waiting for space; the engine pumps it
between steps and wakes its loop through ``on_put``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from guard.errors import GuardError, Overloaded
from scheduler_ref.request import Request

Op = Literal["add", "abort"]


@dataclass(frozen=True, eq=False)
class Instruction:
    op: Op
    request_id: str
    depends_on: frozenset[str] = frozenset()
    # SLA: seconds this instruction may wait in the inbox (None: forever). Ignored for aborts.
    timeout_s: float | None = None
    # The request to add (``add`` only).
    request: Request | None = None

    @classmethod
    def add(
        cls,
        request: Request,
        depends_on: Iterable[str] = (),
        timeout_s: float | None = None,
    ) -> Instruction:
        return cls("add", request.request_id, frozenset(depends_on), timeout_s, request)

    @classmethod
    def abort(cls, request_id: str) -> Instruction:
        return cls("abort", request_id)


@dataclass(eq=False)
class _Entry:
    instruction: Instruction
    depends_on: frozenset[str]
    deadline: float | None = field(default=None)


class Inbox:
    def __init__(
        self,
        capacity: int,
        dispatch_timeout_s: float = 0.5,
        *,
        clock: Callable[[], float] = time.monotonic,
        is_pending: Callable[[str], bool] = lambda _rid: False,
    ) -> None:
        if capacity < 1:
            raise ValueError("inbox capacity must be >= 1")
        self.capacity = capacity
        self.dispatch_timeout_s = dispatch_timeout_s
        self.clock = clock
        # Whether an id is pending downstream (in the scheduler); set by the engine core.
        self.is_pending = is_pending
        # Called after anything is put, so the engine loop can wake up.
        self.on_put: Callable[[], None] | None = None
        # Insertion-ordered: FIFO among ready instructions, O(1) cancel.
        self._adds: dict[str, _Entry] = {}
        self._aborts: dict[str, None] = {}  # an ordered set
        self._putters: list[asyncio.Future[None]] = []
        self.rejected_full = 0
        self.expired = 0

    # -- size --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """``add`` instructions held (the bounded part)."""
        return len(self._adds)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._adds

    @property
    def num_aborts(self) -> int:
        return len(self._aborts)

    def full(self) -> bool:
        return len(self._adds) >= self.capacity

    def has_work(self) -> bool:
        return bool(self._adds or self._aborts)

    # -- putting -----------------------------------------------------------------------------

    def put_nowait(self, instruction: Instruction) -> Instruction | None:
        """Enqueue, or raise ``queue_full`` at once when there is no room.

        For an abort whose ``add`` was still here, that cancelled ``add`` is returned.
        """
        rid = instruction.request_id
        if instruction.op == "abort":
            entry = self._adds.pop(rid, None)
            if entry is not None:
                self._wake_putter()
                return entry.instruction
            if rid in self._aborts or not self.is_pending(rid):
                return None  # already being aborted, or unknown: nothing to do
            self._aborts[rid] = None
        else:
            if instruction.request is None:
                raise ValueError("an add instruction carries its request")
            if rid in self._adds or rid in self._aborts:
                raise GuardError(
                    "duplicate_request_id", f"request id {rid!r} is already queued", status=409
                )
            if self.full():
                self.rejected_full += 1
                raise self._full_error(0.0)
            deps = frozenset(d for d in instruction.depends_on if self._pending(d) and d != rid)
            timeout = instruction.timeout_s
            deadline = None if timeout is None else self.clock() + timeout
            self._adds[rid] = _Entry(instruction, deps, deadline)
        if self.on_put is not None:
            self.on_put()
        return None

    async def put(self, instruction: Instruction, timeout_s: float | None = None) -> None:
        """Enqueue; if the inbox is full, wait up to the dispatch timeout for a slot."""
        if instruction.op == "abort" or not self.full():
            self.put_nowait(instruction)
            return
        timeout = self.dispatch_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                while self.full():
                    fut: asyncio.Future[None] = loop.create_future()
                    self._putters.append(fut)
                    try:
                        await fut
                    except BaseException:
                        if fut.done() and not fut.cancelled():
                            self._wake_putter()  # we were handed a slot: pass it on
                        raise
                    finally:
                        if fut in self._putters:
                            self._putters.remove(fut)
        except TimeoutError:
            self.rejected_full += 1
            raise self._full_error(timeout) from None
        self.put_nowait(instruction)

    def _full_error(self, waited_s: float) -> Overloaded:
        return Overloaded(
            "queue_full",
            f"instruction queue full: the inbox stayed at its capacity of {self.capacity} "
            f"for {waited_s * 1000:.0f} ms; retry later",
            headers={"Retry-After": "1"},
        )

    def _wake_putter(self) -> None:
        while self._putters:
            fut = self._putters.pop(0)
            if not fut.done():
                fut.set_result(None)
                return

    def _pending(self, request_id: str) -> bool:
        return request_id in self._adds or self.is_pending(request_id)

    # -- taking ------------------------------------------------------------------------------

    def pop_aborts(self) -> list[str]:
        """Ids to abort in the scheduler."""
        aborts = list(self._aborts)
        self._aborts.clear()
        return aborts

    def cancel(self, request_id: str) -> Instruction | None:
        """Remove a pending ``add``; the instruction, or None if it is not here."""
        entry = self._adds.pop(request_id, None)
        if entry is None:
            return None
        self._wake_putter()
        return entry.instruction

    def expire(self) -> list[Instruction]:
        """Drop and return every ``add`` whose SLA has passed."""
        now = self.clock()
        gone = [
            rid for rid, e in self._adds.items() if e.deadline is not None and e.deadline <= now
        ]
        out = []
        for rid in gone:
            out.append(self._adds.pop(rid).instruction)
            self._wake_putter()
        self.expired += len(out)
        return out

    def pop_ready(self) -> Instruction | None:
        """The oldest ``add`` whose dependencies are all done, or None."""
        for rid, entry in self._adds.items():
            if not any(self._pending(d) for d in entry.depends_on):
                del self._adds[rid]
                self._wake_putter()
                return entry.instruction
        return None
