"""The guard's checks: pure functions of (request view, policy) returning a CheckResult.

Each check is linear in the request and stops at the first limit crossed; a rejection carries a
stable code, an HTTP status and a message (docs/ERRORS.md, section "guard"). ``CHECKS`` maps the
names a policy's ``checks`` list uses to the functions; :mod:`guard.pipeline` runs them in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from guard.checks._fields import lax_bool
from guard.checks._result import PASS, CheckFn, CheckResult, Mutation, apply_mutations
from guard.checks.fanout import check_fanout
from guard.checks.guided import check_guided
from guard.checks.multimodal import check_multimodal
from guard.checks.schema import check_schema
from guard.checks.templates import check_templates
from guard.checks.tokens import check_tokens
from guard.policy._models import CHECK_NAMES

__all__ = [
    "CHECKS",
    "PASS",
    "CheckFn",
    "CheckResult",
    "Mutation",
    "apply_mutations",
    "check_fanout",
    "check_guided",
    "check_multimodal",
    "check_schema",
    "check_templates",
    "check_tokens",
    "lax_bool",
]

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
assert tuple(CHECKS) == CHECK_NAMES, "guard.policy._models.CHECK_NAMES must list every check"
