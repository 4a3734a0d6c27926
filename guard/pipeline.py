"""The check pipeline: bytes in, a :class:`Verdict` out, never an exception.

``evaluate_body(raw, path, headers, policy)`` is what the HTTP app and the dry-run endpoint
(``POST /guard/v1/check``) both call: route allowlist, API key, bounded JSON parse
(:func:`guard.json._reader.parse_json_body`), a :class:`~guard.request_view.RequestView`, then
``run_checks``: the policy's checks in the policy's order (data: ``policy.checks``), stopping at
the first rejection. The verdict carries what passing checks measured (costs, such as the prompt
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
from guard.errors import GuardError, NotFound
from guard.json import parse_json_body
from guard.policy._models import KeyEntry, Policy
from guard.request_view import HeadersLike, RequestView, normalise_headers, resolve_key

__all__ = [
    "CHECK_FAILED",
    "Verdict",
    "checks_for",
    "evaluate_body",
    "run_checks",
]

# A check raised something other than a GuardError: a bug, refused (fail closed) all the same.
CHECK_FAILED = "request_check_failed"
ROUTE_NOT_ALLOWED = "route_not_allowed"

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_BODYLESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one request.

    ``costs``: measurements merged from the checks that passed (``prompt_tokens``,
    ``tokens_reserved``, ``body_bytes``, ...); ``mutations``: to apply before forwarding
    (:meth:`forward_body`); ``durations``: seconds per step (``parse`` and each check run), in
    order; ``view``: the request view when the body was parsed.
    """

    allowed: bool
    rejection: GuardError | None = None
    costs: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    mutations: tuple[Mutation, ...] = ()
    durations: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    view: RequestView | None = None

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
    return _verdict(True, None, costs, mutations, durations, view)


def _verdict(
    allowed: bool,
    rejection: GuardError | None,
    costs: dict[str, int],
    mutations: list[Mutation],
    durations: dict[str, float],
    view: RequestView | None,
) -> Verdict:
    return Verdict(
        allowed,
        rejection,
        MappingProxyType(costs),
        tuple(mutations),
        MappingProxyType(durations),
        view,
    )


class _Unresolved:
    """The key has not been resolved yet (``None`` is a resolved anonymous caller)."""


_UNRESOLVED = _Unresolved()


def evaluate_body(
    raw: bytes,
    path: str,
    headers: HeadersLike,
    policy: Policy,
    *,
    method: str = "POST",
    key: KeyEntry | _Unresolved | None = _UNRESOLVED,
) -> Verdict:
    """Route, key, bounded parse and checks for one request body; never raises.

    A caller that has resolved the key already (:func:`~guard.request_view.resolve_key`, as
    the gateway does before reading the body) passes it as ``key`` (``None``: anonymous) with
    ``headers`` as :func:`~guard.request_view.normalise_headers` returned them, so that
    neither is done twice.
    """
    return _evaluate(raw, path, headers, policy, method, key)


def _evaluate(
    raw: bytes,
    path: str,
    headers: HeadersLike,
    policy: Policy,
    method: str,
    key: KeyEntry | _Unresolved | None,
) -> Verdict:
    durations: dict[str, float] = {}
    costs: dict[str, int] = {"body_bytes": len(raw)}
    clock = time.perf_counter
    start = clock()
    view: RequestView | None = None
    try:
        clean_path = path.split("?", 1)[0]
        if clean_path not in policy.allowed_routes:
            raise NotFound(ROUTE_NOT_ALLOWED, f"{clean_path[:200]} is not served by this guard")
        if isinstance(key, _Unresolved):
            pairs = normalise_headers(headers)
            key = resolve_key(pairs, policy)
        else:
            pairs = headers  # type: ignore[assignment]  # normalised by the caller
        method = method.upper()
        if method in _BODYLESS and not raw.strip():
            body: Any = None
        else:
            body = parse_json_body(raw, policy.limits.json_, policy.limits.body.largest_body)
        view = RequestView.build(
            body, path=clean_path, method=method, headers=pairs, key=key, raw_size=len(raw)
        )
    except GuardError as exc:
        durations["parse"] = clock() - start
        return _verdict(False, exc, costs, [], durations, view)
    except Exception as exc:
        durations["parse"] = clock() - start
        return _verdict(False, _internal(exc), costs, [], durations, view)
    durations["parse"] = clock() - start
    return run_checks(view, policy, durations=durations, costs=costs)
