"""The checks by the names a policy's ``checks`` lists, and what they read of a policy together."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult
from guard.checks.fanout import FanoutReads, check_fanout
from guard.checks.guided import GuidedReads, check_guided
from guard.checks.multimodal import MultimodalReads, check_multimodal
from guard.checks.schema import SchemaReads, check_schema
from guard.checks.templates import TemplatesReads, check_templates
from guard.checks.tokens import TokensReads, check_tokens
from guard.request import RequestView

__all__ = ["CHECKS", "CHECK_NAMES", "CheckFn", "CheckLimits"]


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
