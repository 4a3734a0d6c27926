"""The checks, registered once: by the names a policy's ``checks`` lists (:data:`CHECKS`), with
their limit sets as the policy's sections (:class:`CheckSections`), and what they read of a
policy together (:class:`CheckLimits`).

A new check is registered here and nowhere else: its function in ``CHECKS``, its limit set as a
field of ``CheckSections`` (the policy's ``limits`` inherits them: ``limits.<name>`` in YAML,
``SCHEDGUARD_LIMITS__<NAME>__...``, docs/POLICY.md), its reads among ``CheckLimits``' bases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from pydantic import ConfigDict, Field

from guard._limits import LimitsModel
from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult
from guard.checks._tokens_limits import TokensLimits
from guard.checks.fanout import FanoutLimits, FanoutReads, check_fanout
from guard.checks.guided import GuidedReads, check_guided
from guard.checks.multimodal import MultimodalLimits, MultimodalReads, check_multimodal
from guard.checks.schema import SchemaLimits, SchemaReads, check_schema
from guard.checks.templates import TemplatesLimits, TemplatesReads, check_templates
from guard.checks.tokens import TokensReads, check_tokens
from guard.guided import GuidedLimits
from guard.request import RequestView

__all__ = ["CHECKS", "CHECK_NAMES", "CheckFn", "CheckLimits", "CheckSections"]


class CheckSections(LimitsModel):
    """The checks' limit sets, as sections of the policy's ``limits`` (in the order
    docs/POLICY.md shows them)."""

    schema_: SchemaLimits = Field(
        default_factory=lambda: SchemaLimits(), alias="schema", description="Request field types."
    )
    templates: TemplatesLimits = Field(
        default_factory=lambda: TemplatesLimits(), description="Prompt and chat templates."
    )
    tokens: TokensLimits = Field(default_factory=lambda: TokensLimits(), description="Token caps.")
    fanout: FanoutLimits = Field(
        default_factory=lambda: FanoutLimits(), description="Fan-out caps."
    )
    guided: GuidedLimits = Field(
        default_factory=lambda: GuidedLimits(), description="Guided-decoding constraints."
    )
    multimodal: MultimodalLimits = Field(
        default_factory=lambda: MultimodalLimits(), description="Media parts."
    )

    model_config = ConfigDict(populate_by_name=True)


class CheckLimits(
    FanoutReads, SchemaReads, TemplatesReads, MultimodalReads, TokensReads, GuidedReads, Protocol
):
    """Every limit set a check reads: what a policy's ``limits`` must have."""


CheckFn = Callable[[RequestView, PolicyView[CheckLimits]], CheckResult]

# The checks, in the default order (cheapest first: fan-out reads a few fields and counts lists
# without walking them, so 2,000 messages are refused before the schema types each one; the
# tokenizer and the regex engine last, so that a request refused for a cheap reason never
# reaches them).
CHECKS: Mapping[str, CheckFn] = MappingProxyType(
    {
        "fanout": check_fanout,
        "schema": check_schema,
        "templates": check_templates,
        "multimodal": check_multimodal,
        "tokens": check_tokens,
        "guided": check_guided,
    }
)
CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)
