"""What a check returns: pass (with measured costs and body mutations, as data) or a rejection."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from guard.errors import GuardError
from guard.guided import Compile
from guard.request import RequestView

__all__ = ["PASS", "CheckResult", "Mutation", "apply_mutations", "pure_check"]

_NO_COSTS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Mutation:
    """Set ``path`` (keys and list indices from the body's root) to ``value`` before forwarding.

    ``reason`` says why, for logs and the dry-run endpoint (``default_max_tokens``, say).
    """

    path: tuple[str | int, ...]
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": list(self.path), "value": self.value, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Pass (``rejection`` is None) with ``costs`` measured, ``mutations`` to apply and the
    constraints the upstream will ``compile`` (for the compile budget), or a rejection carrying
    its stable code, HTTP status and message."""

    rejection: GuardError | None = None
    costs: Mapping[str, int] = field(default_factory=lambda: _NO_COSTS)
    mutations: tuple[Mutation, ...] = ()
    compiles: tuple[Compile, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.rejection is None

    @classmethod
    def passed(
        cls,
        costs: Mapping[str, int] | None = None,
        mutations: tuple[Mutation, ...] = (),
        compiles: tuple[Compile, ...] = (),
    ) -> CheckResult:
        return cls(None, MappingProxyType(dict(costs)) if costs else _NO_COSTS, mutations, compiles)

    @classmethod
    def rejected(cls, error: GuardError) -> CheckResult:
        return cls(error)


PASS = CheckResult()

PolicyT = TypeVar("PolicyT")


def pure_check(
    fn: Callable[[RequestView, PolicyT], CheckResult | None],
) -> Callable[[RequestView, PolicyT], CheckResult]:
    """Write a check as code that raises :class:`GuardError` and returns costs when it passes;
    callers get a :class:`CheckResult` either way (``None`` is a plain pass)."""

    @functools.wraps(fn)
    def run(view: RequestView, policy: PolicyT) -> CheckResult:
        try:
            result = fn(view, policy)
        except GuardError as exc:
            return CheckResult(exc)
        return PASS if result is None else result

    return run


def apply_mutations(body: Any, mutations: tuple[Mutation, ...]) -> Any:
    """A copy of ``body`` with ``mutations`` applied; ``body`` itself is left untouched.

    Only the containers on each mutated path are copied (shallowly), so this costs the depth of
    the paths, not the size of the body.
    """
    if not mutations:
        return body
    root: Any = copy.copy(body)
    for mutation in mutations:
        *parents, last = mutation.path
        node = root
        for key in parents:
            child = copy.copy(node[key])
            node[key] = child
            node = child
        node[last] = mutation.value
    return root
