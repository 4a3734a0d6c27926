"""The priority a request is scheduled with upstream (issue 25): the key's, or a worse one.

vLLM 0.32 under ``--scheduling-policy priority`` serves its waiting requests by ``(priority,
arrival)``, lower first, and preempts the running request with the highest value when a
better one needs its KV blocks (``vllm/v1/core/sched/request_queue.py``,
``vllm/v1/core/sched/scheduler.py``); under FCFS it ignores the value. A request's priority is
its body's ``priority`` (every generation and pooling request model; tokenize has none) unless
the ``X-Vllm-Priority`` header is an integer, which overrides it on chat, completions and
responses (``vllm/entrypoints/generate/base/serving.py``, ``_get_priority``).

``best`` is what the policy grants the caller (:meth:`guard.policy.Policy.priority_for`):

- ``None``, the upstream does not schedule by priority: ``priority`` 0 only
  (``field_not_allowed`` otherwise), nothing injected, the header stripped by the HTTP layer;
- an integer: the caller's priority may be that or worse (higher), never better (400
  ``priority_not_allowed``). Asked for by the header, its value is moved into the body (the
  header itself is never forwarded then: :func:`guard.http.dropped_headers`); asked for by
  nobody, ``best`` is injected (a top-level member the body lacks: spliced in, not
  re-serialised), except 0, vLLM's default, so that an ordinary request is not altered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from guard.checks._result import Mutation
from guard.errors import GuardError
from guard.request import Endpoint

__all__ = [
    "HEADER_ENDPOINTS",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "PRIORITY_NOT_ALLOWED",
    "SCHEDULED_ENDPOINTS",
    "Priority",
    "check_priority",
]

PRIORITY_NOT_ALLOWED = "priority_not_allowed"
# vLLM's request models bound `priority` to a signed 64-bit integer (the engine's msgspec
# encoding); the header's value is not bounded by them, so the guard bounds both.
PRIORITY_MIN = -(2**63)
PRIORITY_MAX = 2**63 - 1
# A priority in the policy: strict (no "5", 5.0 or true), as the limits' integers.
Priority = Annotated[int, Field(strict=True, ge=PRIORITY_MIN, le=PRIORITY_MAX)]
# Where vLLM reads `X-Vllm-Priority` (elsewhere it ignores the header; stripped, so is the guard).
HEADER_ENDPOINTS: frozenset[Endpoint] = frozenset({"chat", "completions", "responses"})
# Where the engine schedules the request by its body's `priority`: the key's is injected there.
SCHEDULED_ENDPOINTS: frozenset[Endpoint] = HEADER_ENDPOINTS | {
    "embeddings",
    "pooling",
    "score",
    "rerank",
}
_HEADER_INT = re.compile(r"[+-]?[0-9]{1,20}")


def _header_priority(value: str) -> int:
    """The header's integer. vLLM ignores a value ``int()`` cannot read; the guard refuses it
    instead: the header is not forwarded, so what it meant must be decided here."""
    text = value.strip()
    number = int(text) if _HEADER_INT.fullmatch(text) else None
    if number is None or not PRIORITY_MIN <= number <= PRIORITY_MAX:
        raise GuardError(
            "invalid_value",
            "X-Vllm-Priority must be an integer (a signed 64-bit one)",
            param="X-Vllm-Priority",
        )
    return number


def _refuse_off(asked: Any) -> None:
    if asked != 0 or isinstance(asked, bool):
        raise GuardError(
            "field_not_allowed",
            "priority other than 0 is not accepted: this guard's upstream does not schedule "
            "by priority (upstream.priority_scheduling is off), and under vLLM's priority "
            "scheduling a lower value would preempt other tenants' requests",
            param="priority",
        )


def check_priority(
    body: Mapping[str, Any], endpoint: Endpoint, header: str | None, best: int | None
) -> tuple[Mutation, ...]:
    """Raise for a priority the caller may not have; return the mutation that sets the one it
    is scheduled with when the body does not say it already. ``header``: the client's
    ``X-Vllm-Priority``; ``best``: the caller's priority (``None``: no priority scheduling)."""
    asked = body.get("priority")
    if best is None:
        if asked is not None:
            _refuse_off(asked)
        return ()
    wanted, source = asked, "priority"
    if header is not None and endpoint in HEADER_ENDPOINTS:
        wanted, source = _header_priority(header), "X-Vllm-Priority"
    if wanted is None:
        if best != 0 and endpoint in SCHEDULED_ENDPOINTS:
            return (Mutation(("priority",), best, "key_priority"),)
        return ()
    if type(wanted) is not int:
        return ()  # the schema check types the body's
    if wanted < best:
        raise GuardError(
            PRIORITY_NOT_ALLOWED,
            f"{source} {wanted} is better than this key may ask for: its requests are "
            f"scheduled at priority {best} or a higher (later) value",
            param=source,
        )
    if wanted > PRIORITY_MAX:
        raise GuardError("invalid_value", f"priority must be at most {PRIORITY_MAX}", param=source)
    if wanted != asked or type(asked) is not int:
        return (Mutation(("priority",), wanted, "priority_header"),)
    return ()
