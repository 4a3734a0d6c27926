"""The guided-decoding check: delegates to :func:`guard.guided.check_guided_decoding` with the
policy's ``limits.guided`` (regexes, JSON schemas, grammars, choice lists).

Codes: ``guided_*`` (see :mod:`guard.guided`).
"""

from __future__ import annotations

from guard._policy_models import Policy
from guard.checks._result import CheckResult, pure_check
from guard.guided import check_guided_decoding
from guard.request_view import RequestView

__all__ = ["check_guided"]


@pure_check
def check_guided(view: RequestView, policy: Policy) -> CheckResult | None:
    body = view.obj
    if body is not None:
        check_guided_decoding(body, policy.guided_limits)
    return None
