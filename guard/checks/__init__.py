"""The guard's checks: pure functions of (request view, policy) returning a CheckResult, each
with its limit set beside it.

Each check is linear in the request and stops at the first limit crossed; a rejection carries a
stable code, an HTTP status and a message (docs/ERRORS.md, section "guard"). A check reads the
policy through :class:`PolicyView` (its limit sets, the upstream's kind), and declares its own
limit set in its module (:class:`TokensLimits` in :mod:`guard.checks.tokens`, ...), which the
policy composes as ``limits.<name>``. ``CHECKS`` maps the names a policy's ``checks`` list uses to
the functions; :mod:`guard.pipeline` runs them in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from guard.checks._policy import LimitsView, PolicyView
from guard.checks._result import PASS, CheckFn, CheckResult, Mutation, apply_mutations
from guard.checks.fanout import FanoutLimits, check_fanout
from guard.checks.guided import check_guided
from guard.checks.multimodal import MultimodalLimits, check_multimodal
from guard.checks.schema import SchemaLimits, check_schema
from guard.checks.templates import RequestTemplateLimits, TemplatesLimits, check_templates
from guard.checks.tokens import DEFAULT_CONTEXT_LENGTH, TokensLimits, check_tokens

__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "DEFAULT_CONTEXT_LENGTH",
    "PASS",
    "CheckFn",
    "CheckResult",
    "FanoutLimits",
    "LimitsView",
    "MultimodalLimits",
    "Mutation",
    "PolicyView",
    "RequestTemplateLimits",
    "SchemaLimits",
    "TemplatesLimits",
    "TokensLimits",
    "apply_mutations",
    "check_fanout",
    "check_guided",
    "check_multimodal",
    "check_schema",
    "check_templates",
    "check_tokens",
]

# The checks the pipeline knows, by the names a policy's `checks` lists, in the default order
# (cheapest first: fan-out reads a few fields and counts lists without walking them, so 2,000
# messages are refused before the schema types each one; the tokenizer and the regex engine
# last, so that a request refused for a cheap reason never reaches them).
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
