"""What a check reads of the policy: the limit sets it names, the upstream's kind in force and
the caller's priority.

Each check declares the sections it reads as a protocol beside itself (``FanoutReads``: the
``fanout`` and ``tokens`` limit sets) and takes a ``PolicyView`` of them, not a
:class:`guard.policy.Policy`: so the policy can compose the checks' limit sets (each declared
beside its check) without an import loop. The registry (:mod:`guard.checks._registry`) joins
the checks' reads into one view, which ``Policy`` satisfies structurally: mypy checks it where
the pipeline passes a policy to the checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from guard.http import UpstreamKind
    from guard.request import CallerKey

__all__ = ["PolicyView"]

Sections = TypeVar("Sections", covariant=True)


class PolicyView(Protocol[Sections]):
    """A policy whose ``limits`` has the sections ``Sections`` names."""

    @property
    def limits(self) -> Sections: ...

    @property
    def upstream_kind(self) -> UpstreamKind: ...

    def priority_for(self, key: CallerKey | None) -> int | None:
        """The best priority the upstream may schedule this caller's requests with; ``None``
        when it does not schedule by priority."""
        ...
