"""The guard's policy: what it accepts, loaded from YAML, overridable from the environment.

``load_policy(path)`` reads a YAML file (or nothing: the defaults), applies ``SCHEDGUARD_*``
environment variables, and validates everything at once, raising one :class:`PolicyError` that
names every bad field (``limits.tokens.max_prompt_tokens: must be > 0``). The result is an
immutable :class:`Policy`; ``policy_to_yaml(policy)`` prints it back (``schedguard policy
show``), with API keys shown only as SHA-256 digests.

Environment overrides: ``SCHEDGUARD_`` + the field's path in upper or lower case, segments joined
by ``__``; the value is parsed as YAML, so ``4096``, ``true``, ``null`` and ``[a, b]`` are
typed::

    SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS=4096
    SCHEDGUARD_ROUTES='["/v1/responses", "/tokenize"]'
    SCHEDGUARD_KEYS='[{key_sha256: 9f86d0..., tenant: team-a}]'

Every field is documented in docs/POLICY.md (generated from the field descriptions by
``python -m guard.policy --write docs/POLICY.md``). The sections the guard's code reads are its
limit sets, declared once next to that code: each check's beside the check (:class:`~guard.checks.TokensLimits`,
...), :class:`~guard.http.FramingLimits`, :class:`~guard.json.JsonLimits`,
:class:`~guard.guided.GuidedLimits`, :class:`~guard.http.UpstreamConfig`, :class:`RatePolicy`.
"""

from guard.errors import PolicyError
from guard.policy._env import ENV_PREFIX, ENV_SEPARATOR, OTHER_VARIABLES, policy_variables
from guard.policy._load import (
    default_policy,
    load_policy,
    policy_from_yaml,
    policy_to_yaml,
)
from guard.policy._models import (
    BASE_ROUTES,
    AdminPolicy,
    KeyEntry,
    LimitsPolicy,
    ObservabilityPolicy,
    Policy,
    RateOverrides,
    RatePolicy,
    key_digest,
)

__all__ = [
    "BASE_ROUTES",
    "ENV_PREFIX",
    "ENV_SEPARATOR",
    "OTHER_VARIABLES",
    "AdminPolicy",
    "KeyEntry",
    "LimitsPolicy",
    "ObservabilityPolicy",
    "Policy",
    "PolicyError",
    "RateOverrides",
    "RatePolicy",
    "default_policy",
    "key_digest",
    "load_policy",
    "policy_from_yaml",
    "policy_to_yaml",
    "policy_variables",
]
