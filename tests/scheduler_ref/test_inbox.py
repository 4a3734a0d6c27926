"""The bounded inbox: capacity, dispatch timeout, aborts, dependencies, SLA expiry."""

from __future__ import annotations

import asyncio
import time

import pytest

from guard.errors import GuardError, Overloaded
from scheduler_ref.inbox import Inbox, Instruction
from scheduler_ref.request import Request, SamplingParams


def _add(rid: str, deps: tuple[str, ...] = (), sla: float | None = None) -> Instruction:
    req = Request(rid, [1, 2], SamplingParams(), max_tokens=4)
    return Instruction.add(req, deps, sla)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_put_nowait_is_bounded_and_fifo() -> None:
    inbox = Inbox(2)
    inbox.put_nowait(_add("a"))
    inbox.put_nowait(_add("b"))
    with pytest.raises(Overloaded) as err:
        inbox.put_nowait(_add("c"))
    assert err.value.code == "queue_full" and err.value.status == 503
    assert "instruction queue full" in err.value.message
    assert len(inbox) == 2 and inbox.rejected_full == 1
    first = inbox.pop_ready()
    second = inbox.pop_ready()
    assert first is not None and second is not None
    assert (first.request_id, second.request_id) == ("a", "b")
    assert inbox.pop_ready() is None


def test_duplicate_ids_are_refused() -> None:
    inbox = Inbox(4)
    inbox.put_nowait(_add("a"))
    with pytest.raises(GuardError) as err:
        inbox.put_nowait(_add("a"))
    assert err.value.code == "duplicate_request_id"


def test_abort_cancels_a_queued_add_and_frees_its_slot() -> None:
    inbox = Inbox(1)
    inbox.put_nowait(_add("a"))
    cancelled = inbox.put_nowait(Instruction.abort("a"))
    assert cancelled is not None and cancelled.request_id == "a"
    assert len(inbox) == 0 and inbox.pop_aborts() == []
    inbox.put_nowait(_add("b"))  # the slot is free again


def test_aborts_are_never_refused_deduplicated_and_only_for_pending_ids() -> None:
    downstream = {"x"}
    inbox = Inbox(1, is_pending=downstream.__contains__)
    inbox.put_nowait(_add("a"))  # full
    for _ in range(3):
        inbox.put_nowait(Instruction.abort("x"))
    inbox.put_nowait(Instruction.abort("unknown"))
    assert inbox.num_aborts == 1
    assert inbox.pop_aborts() == ["x"]


def test_dependencies_hold_an_add_until_they_are_done() -> None:
    downstream = {"d"}
    inbox = Inbox(4, is_pending=downstream.__contains__)
    inbox.put_nowait(_add("a", deps=("d", "never-seen")))
    inbox.put_nowait(_add("b"))
    inbox.put_nowait(_add("c", deps=("b",)))
    got = inbox.pop_ready()
    assert got is not None and got.request_id == "b"  # a waits for d; c waited for b
    downstream.add("b")
    assert inbox.pop_ready() is None
    downstream.clear()
    got = inbox.pop_ready()
    assert got is not None and got.request_id == "a"
    got = inbox.pop_ready()
    assert got is not None and got.request_id == "c"


def test_dependencies_on_later_ids_are_dropped_so_nothing_deadlocks() -> None:
    inbox = Inbox(4)
    inbox.put_nowait(_add("a", deps=("b", "a")))  # b not pending yet, a is itself
    inbox.put_nowait(_add("b", deps=("a",)))
    order = [i.request_id for i in iter(inbox.pop_ready, None)]
    assert order == ["a", "b"]


def test_instructions_expire_after_their_sla() -> None:
    clock = FakeClock()
    inbox = Inbox(4, clock=clock)
    inbox.put_nowait(_add("fast", sla=1.0))
    inbox.put_nowait(_add("slow", sla=10.0))
    inbox.put_nowait(_add("forever"))
    clock.t = 5.0
    assert [i.request_id for i in inbox.expire()] == ["fast"]
    clock.t = 1e9
    assert [i.request_id for i in inbox.expire()] == ["slow"]
    assert inbox.expired == 2 and len(inbox) == 1


async def test_put_waits_for_room_then_fails_after_the_dispatch_timeout() -> None:
    inbox = Inbox(1, dispatch_timeout_s=0.05)
    await inbox.put(_add("a"))
    t0 = time.monotonic()
    with pytest.raises(Overloaded) as err:
        await inbox.put(_add("b"))
    waited = time.monotonic() - t0
    assert err.value.code == "queue_full"
    assert err.value.headers["Retry-After"] == "1"
    assert 0.04 <= waited < 1.0
    assert len(inbox) == 1


async def test_put_succeeds_when_a_slot_frees_within_the_timeout() -> None:
    inbox = Inbox(1, dispatch_timeout_s=5.0)
    inbox.put_nowait(_add("a"))
    waiter = asyncio.create_task(inbox.put(_add("b")))
    await asyncio.sleep(0)
    assert not waiter.done()
    assert inbox.pop_ready() is not None
    await asyncio.wait_for(waiter, 1.0)
    assert "b" in inbox


async def test_a_cancelled_putter_passes_its_slot_on() -> None:
    inbox = Inbox(1, dispatch_timeout_s=5.0)
    inbox.put_nowait(_add("a"))
    first = asyncio.create_task(inbox.put(_add("b")))
    second = asyncio.create_task(inbox.put(_add("c")))
    await asyncio.sleep(0)
    inbox.pop_ready()  # wakes `first` ...
    first.cancel()  # ... which goes away before using the slot
    await asyncio.wait_for(second, 1.0)
    assert "c" in inbox and "b" not in inbox
    with pytest.raises(asyncio.CancelledError):
        await first
