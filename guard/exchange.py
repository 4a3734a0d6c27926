"""The record of one request through the guard, whatever carries it (the ASGI proxy, Envoy's
ext_proc), and what the front half decided about it."""

from __future__ import annotations

from dataclasses import dataclass

from guard.http import RequestHead, SseRelay
from guard.pipeline import Verdict
from guard.policy import KeyEntry
from guard.request import ANONYMOUS_TENANT

__all__ = ["Admission", "Exchange", "Opened", "check_outcomes"]


@dataclass(slots=True)
class Exchange:
    """What is known about one request, filled in as it goes; read by the recorders."""

    method: str
    route: str
    path: str
    start: float
    target: str = ""  # the path sent upstream (upstream_target), once the route is settled
    request_id: str = ""
    tenant: str | None = None
    status: int = 500
    code: str | None = None
    stream: bool = False
    bytes_in: int = 0
    bytes_out: int = 0
    overhead_s: float = 0.0
    queue_s: float | None = None
    upstream_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    response_started: bool = False
    client_gone: bool = False
    finished: bool = False  # the last message is being sent: a disconnect now is not one
    body_pending: bool = False  # a body was announced and not read yet
    checks: tuple[tuple[str, str], ...] = ()
    upstream_code: str | None = None  # the code of an error the upstream answered with
    read_s: float = 0.0  # reading the body: the client's time, not the guard's overhead
    relay: SseRelay | None = None  # a streamed response's relay (its token count so far)
    truncated: str | None = None  # how the upstream's stream ended early, if it did
    ended: float = 0.0  # when the response's last message went out (0: at the record)


@dataclass(slots=True)
class Opened:
    """A request whose head passed (:meth:`~guard.gateway.Gateway.open`): its framing facts,
    the headers the key and the checks read, and the caller's key entry and tenant."""

    head: RequestHead
    pairs: list[tuple[str, str]]
    key: KeyEntry | None
    tenant: str
    takes_body: bool  # a POST route (checked); a GET takes no body
    flow: str  # whose turn it is in the global queue: the tenant, or an anonymous address


@dataclass(slots=True)
class Admission:
    """What the front half decided about one request (:meth:`~guard.gateway.Gateway.judge`).

    ``verdict``: allowed, or refused for its framing (step ``framing``) or by a check;
    ``checked``: whether the checks ran (their timings are metrics); ``key`` and ``tenant``: the
    caller's entry (None: anonymous) and tenant; ``head`` and ``body``: the request as read,
    when it was; ``flow``: its place in the fair queue (the tenant, or an anonymous address).
    """

    verdict: Verdict
    checked: bool = False
    key: KeyEntry | None = None
    tenant: str = ANONYMOUS_TENANT
    head: RequestHead | None = None
    body: bytes = b""
    flow: str = ANONYMOUS_TENANT


def check_outcomes(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """``(step, "pass" or the code)`` for each step the pipeline ran, in order."""
    names = list(verdict.durations)
    outcomes = [(name, "pass") for name in names]
    if verdict.rejection is not None and outcomes:
        outcomes[-1] = (names[-1], verdict.rejection.code)
    return tuple(outcomes)
