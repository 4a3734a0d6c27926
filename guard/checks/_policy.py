"""What a check reads of the policy: the limit sets it names, and the upstream's kind in force.

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

__all__ = ["PolicyView"]

Sections = TypeVar("Sections", covariant=True)


class PolicyView(Protocol[Sections]):
    """A policy whose ``limits`` has the sections ``Sections`` names."""

    @property
    def limits(self) -> Sections: ...

    @property
    def upstream_kind(self) -> UpstreamKind: ...
