"""The waiting queue: priority order with aging, FCFS among equals.

A request's effective priority at step ``t`` is ``priority - aging_rate * (t - arrival_step)``.
Every waiting request ages at the same rate, so the order between two requests never changes
while they wait and the queue can sort on the constant ``priority + aging_rate * arrival_step``
(the :attr:`~scheduler_ref.request.Request.sort_key`, with an arrival counter to break ties).
A request of priority ``p`` that arrived at step ``a`` is therefore overtaken only by requests
arriving before ``a + (p - p_min) / aging_rate``: finitely many, so nothing starves. Preempted
requests keep their key, and with it the age they had already earned.

Removal (abort) is lazy: the entry is forgotten in a dict and skipped when it reaches the top;
the heap is rebuilt when stale entries outnumber live ones, so its size stays within twice the
number of live requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from scheduler_ref.request import Request


class PriorityAgingQueue:
    def __init__(self, aging_rate: float) -> None:
        if aging_rate < 0:
            raise ValueError("aging_rate must be >= 0")
        self.aging_rate = aging_rate
        self._heap: list[tuple[tuple[float, int], str]] = []
        self._live: dict[str, Request] = {}
        self._seq = 0

    def key_for(self, request: Request, arrival_step: int) -> tuple[float, int]:
        """Assign a new request its arrival step and constant sort key."""
        self._seq += 1
        request.arrival_step = arrival_step
        request.sort_key = (request.priority + self.aging_rate * arrival_step, self._seq)
        return request.sort_key

    def push(self, request: Request) -> None:
        """Add a request whose ``sort_key`` is set (new: see :meth:`key_for`; preempted: kept)."""
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id!r} is already waiting")
        self._live[request.request_id] = request
        heapq.heappush(self._heap, (request.sort_key, request.request_id))

    def peek(self) -> Request | None:
        """The request with the best effective priority, or None."""
        heap = self._heap
        while heap:
            key, rid = heap[0]
            req = self._live.get(rid)
            if req is not None and req.sort_key == key:
                return req
            heapq.heappop(heap)
        return None

    def pop(self) -> Request:
        req = self.peek()
        if req is None:
            raise IndexError("pop from an empty waiting queue")
        heapq.heappop(self._heap)
        del self._live[req.request_id]
        return req

    def remove(self, request_id: str) -> Request | None:
        req = self._live.pop(request_id, None)
        if req is not None and len(self._heap) > 2 * len(self._live) + 16:
            self._heap = [(r.sort_key, rid) for rid, r in self._live.items()]
            heapq.heapify(self._heap)
        return req

    def effective_priority(self, request: Request, step: int) -> float:
        return request.priority - self.aging_rate * (step - request.arrival_step)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._live

    def __iter__(self) -> Iterator[Request]:
        """Live requests, in no particular order."""
        return iter(list(self._live.values()))
