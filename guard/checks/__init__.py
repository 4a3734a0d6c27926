"""The guard's checks: pure functions of (request view, policy) returning a CheckResult, each
with its limit set beside it.

Each check is linear in the request and stops at the first limit crossed; a rejection carries a
stable code, an HTTP status and a message (docs/ERRORS.md, section "guard"). A check declares
its own limit set in its module (:class:`FanoutLimits` in :mod:`guard.checks.fanout`, ...; the
tokens check's in a module of its own, :class:`TokensLimits`, which two other checks read), which
the policy composes as ``limits.<name>``; and it reads the policy through a
:class:`PolicyView` of the limit sets it names (``FanoutReads``, ...). ``CHECKS`` maps the names
a policy's ``checks`` list uses to the functions; :mod:`guard.pipeline` runs them in order.
"""

from guard.checks._llamacpp import check_llama_cpp_shapes
from guard.checks._logprob_work import logprob_work
from guard.checks._policy import PolicyView
from guard.checks._priority import Priority
from guard.checks._registry import CHECK_NAMES, CHECKS, CheckFn, CheckLimits, CheckSections
from guard.checks._result import PASS, CheckResult, Mutation, apply_mutations
from guard.checks._tokens_limits import DEFAULT_CONTEXT_LENGTH, TokensLimits
from guard.checks.fanout import FanoutLimits, check_fanout
from guard.checks.guided import check_guided
from guard.checks.multimodal import MultimodalLimits, check_multimodal
from guard.checks.schema import SchemaLimits, check_schema
from guard.checks.templates import RequestTemplateLimits, TemplatesLimits, check_templates
from guard.checks.tokens import check_tokens

__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "DEFAULT_CONTEXT_LENGTH",
    "PASS",
    "CheckFn",
    "CheckLimits",
    "CheckResult",
    "CheckSections",
    "FanoutLimits",
    "MultimodalLimits",
    "Mutation",
    "PolicyView",
    "Priority",
    "RequestTemplateLimits",
    "SchemaLimits",
    "TemplatesLimits",
    "TokensLimits",
    "apply_mutations",
    "check_fanout",
    "check_guided",
    "check_llama_cpp_shapes",
    "check_multimodal",
    "check_schema",
    "check_templates",
    "check_tokens",
    "logprob_work",
]
