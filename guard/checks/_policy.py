"""What a check reads of the policy: its limit sets, and the upstream's kind in force.

The checks are typed against these protocols, not against :class:`guard.policy.Policy`, so that
the policy can compose the checks' limit sets (each declared beside its check) without an import
loop; ``Policy`` satisfies them structurally, and mypy checks it wherever a policy is passed to a
check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from guard.checks.fanout import FanoutLimits
    from guard.checks.multimodal import MultimodalLimits
    from guard.checks.schema import SchemaLimits
    from guard.checks.templates import TemplatesLimits
    from guard.checks.tokens import TokensLimits
    from guard.guided import GuidedLimits
    from guard.http import UpstreamKind
    from guard.json import JsonLimits

__all__ = ["LimitsView", "PolicyView"]


class LimitsView(Protocol):
    """The limit sets the checks read (the policy's ``limits``)."""

    @property
    def json_(self) -> JsonLimits: ...

    @property
    def schema_(self) -> SchemaLimits: ...

    @property
    def templates(self) -> TemplatesLimits: ...

    @property
    def tokens(self) -> TokensLimits: ...

    @property
    def fanout(self) -> FanoutLimits: ...

    @property
    def guided(self) -> GuidedLimits: ...

    @property
    def multimodal(self) -> MultimodalLimits: ...


class PolicyView(Protocol):
    """What a check reads of a policy."""

    @property
    def limits(self) -> LimitsView: ...

    @property
    def upstream_kind(self) -> UpstreamKind: ...
