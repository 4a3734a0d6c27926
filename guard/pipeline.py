"""The check pipeline: bytes in, a :class:`Verdict` out, never an exception.

``check_body(raw, path, headers, key, policy)`` is what the gateway's front half calls, for the
proxied path and the dry run (``POST /guard/v1/check``) alike, once framing, route and API key
are settled: bounded JSON parse (:func:`guard.json.parse_json_body`), a
:class:`~guard.request.RequestView`, then ``run_checks``: the policy's checks in the
policy's order (data: ``policy.checks``), stopping at the first rejection.
``evaluate_body(raw, path, headers, policy)`` adds the route and the key, for callers without
the gateway (fuzz targets, tests, benchmarks). The verdict carries what passing checks measured (costs, such as the prompt
tokens a rate limiter charges), the body mutations to apply before forwarding (an injected
``max_tokens``) and how long each step took.

Framing (body size while reading, headers, ``Content-Encoding``, slow bodies) is the HTTP
layer's: ``raw`` is the body as read, already decoded.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from guard.checks import CHECKS, CheckFn, Mutation, apply_mutations
from guard.errors import GuardError
from guard.guided import Compile
from guard.json import parse_json_body
from guard.policy import KeyEntry, Policy
from guard.request import HeadersLike, RequestView, normalise_headers
from guard.routing import resolve_key, route_not_allowed, route_of

__all__ = [
    "CHECK_FAILED",
    "Verdict",
    "check_body",
    "checks_for",
    "evaluate_body",
    "run_checks",
]

# A check raised something other than a GuardError: a bug, refused (fail closed) all the same.
CHECK_FAILED = "request_check_failed"

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_BODYLESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one request.

    ``costs``: measurements merged from the checks that passed (``prompt_tokens``,
    ``tokens_reserved``, ``body_bytes``, ...); ``mutations``: to apply before forwarding
    (:meth:`forward_body`); ``durations``: seconds per step (``parse`` and each check run), in
    order; ``view``: the request view when the body was parsed; ``compiles``: the constraints
    the upstream will compile, with their estimated cold cost (the gateway charges them to the
    tenant's compile budget).
    """

    allowed: bool
    rejection: GuardError | None = None
    costs: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    mutations: tuple[Mutation, ...] = ()
    durations: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    view: RequestView | None = None
    compiles: tuple[Compile, ...] = ()

    @property
    def status(self) -> int:
        return 200 if self.rejection is None else self.rejection.status

    @property
    def code(self) -> str | None:
        return None if self.rejection is None else self.rejection.code

    def forward_body(self, raw: bytes) -> bytes:
        """The body to send upstream: ``raw`` itself, or re-serialised with the mutations."""
        if not self.mutations or self.view is None:
            return raw
        body = apply_mutations(self.view.body, self.mutations)
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        """The dry-run endpoint's answer."""
        rejection = self.rejection
        return {
            "allowed": self.allowed,
            "status": self.status,
            "code": None if rejection is None else rejection.code,
            "message": None if rejection is None else rejection.message,
            "param": None if rejection is None else rejection.param,
            "costs": dict(self.costs),
            "mutations": [m.to_dict() for m in self.mutations],
            "durations_ms": {k: round(v * 1000, 4) for k, v in self.durations.items()},
        }


@functools.lru_cache(maxsize=64)
def _resolve(names: tuple[str, ...]) -> tuple[tuple[str, CheckFn], ...]:
    return tuple((name, CHECKS[name]) for name in names)


def checks_for(policy: Policy) -> tuple[tuple[str, CheckFn], ...]:
    """The (name, check) pairs the policy runs, in its order."""
    return _resolve(policy.checks)


def _internal(exc: BaseException) -> GuardError:
    return GuardError(
        CHECK_FAILED, f"the request could not be checked ({type(exc).__name__}); it was refused"
    )


def run_checks(
    view: RequestView,
    policy: Policy,
    checks: tuple[tuple[str, CheckFn], ...] | None = None,
    *,
    durations: dict[str, float] | None = None,
    costs: dict[str, int] | None = None,
) -> Verdict:
    """Run ``checks`` (default: the policy's) on ``view`` in order; stop at the first rejection."""
    durations = {} if durations is None else durations
    costs = {} if costs is None else costs
    mutations: list[Mutation] = []
    compiles: tuple[Compile, ...] = ()
    clock = time.perf_counter
    for name, check in checks_for(policy) if checks is None else checks:
        start = clock()
        try:
            result = check(view, policy)
        except Exception as exc:  # a bug in a check: refuse, do not crash the request
            durations[name] = clock() - start
            return _verdict(False, _internal(exc), costs, mutations, durations, view)
        durations[name] = clock() - start
        if result.rejection is not None:
            return _verdict(False, result.rejection, costs, mutations, durations, view)
        if result.costs:
            costs.update(result.costs)
        if result.mutations:
            mutations.extend(result.mutations)
        if result.compiles:
            compiles += result.compiles
    return _verdict(True, None, costs, mutations, durations, view, compiles)


def _verdict(
    allowed: bool,
    rejection: GuardError | None,
    costs: dict[str, int],
    mutations: list[Mutation],
    durations: dict[str, float],
    view: RequestView | None,
    compiles: tuple[Compile, ...] = (),
) -> Verdict:
    return Verdict(
        allowed,
        rejection,
        MappingProxyType(costs),
        tuple(mutations),
        MappingProxyType(durations),
        view,
        compiles,
    )


def check_body(
    raw: bytes,
    path: str,
    headers: list[tuple[str, str]],
    key: KeyEntry | None,
    policy: Policy,
    *,
    method: str = "POST",
) -> Verdict:
    """Bounded parse and the policy's checks for a body whose route and caller are settled
    (``headers`` as :func:`~guard.request.normalise_headers` returns them, ``key`` as
    :func:`~guard.routing.resolve_key` does); never raises. The gateway's front half
    (:meth:`guard.gateway.Gateway.judge`) calls it after framing, route and key."""
    durations: dict[str, float] = {}
    costs: dict[str, int] = {"body_bytes": len(raw)}
    clock = time.perf_counter
    start = clock()
    view: RequestView | None = None
    try:
        if method in _BODYLESS and not raw.strip():
            body: Any = None
        else:
            body = parse_json_body(raw, policy.limits.json_, policy.limits.body.largest_body)
        view = RequestView.build(
            body, path=path, method=method, headers=headers, key=key, raw_size=len(raw)
        )
    except GuardError as exc:
        durations["parse"] = clock() - start
        return _verdict(False, exc, costs, [], durations, view)
    except Exception as exc:
        durations["parse"] = clock() - start
        return _verdict(False, _internal(exc), costs, [], durations, view)
    durations["parse"] = clock() - start
    return run_checks(view, policy, durations=durations, costs=costs)


def evaluate_body(
    raw: bytes, path: str, headers: HeadersLike, policy: Policy, *, method: str = "POST"
) -> Verdict:
    """Route, API key, bounded parse and checks for one request body, for callers without the
    gateway (fuzz targets, tests, benchmarks); never raises. The route is judged as the gateway
    judges it (:func:`~guard.routing.route_of`); the method is not checked."""
    start = time.perf_counter()
    clean_path = path.split("?", 1)[0]
    try:
        if route_of(clean_path, policy.allowed_routes) is None:
            raise route_not_allowed(policy.allowed_routes)
        pairs = normalise_headers(headers)
        key = resolve_key(pairs, policy)
    except GuardError as exc:
        durations = {"parse": time.perf_counter() - start}
        return _verdict(False, exc, {"body_bytes": len(raw)}, [], durations, None)
    return check_body(raw, clean_path, pairs, key, policy, method=method.upper())
