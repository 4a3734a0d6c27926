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
``python -m guard.policy --markdown``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from guard._policy_load import (
    ENV_PREFIX,
    ENV_SEPARATOR,
    PolicyError,
    apply_env,
    build_policy,
    parse_yaml,
    read_policy_file,
)
from guard._policy_models import (
    ANONYMOUS_TENANT,
    BASE_ROUTES,
    CHECK_NAMES,
    BodyLimits,
    ChatTemplatePolicy,
    FanoutPolicy,
    GuidedPolicy,
    JsonPolicy,
    KeyEntry,
    LimitsPolicy,
    MultimodalPolicy,
    ObservabilityPolicy,
    Policy,
    RateOverrides,
    RatePolicy,
    SchemaPolicy,
    TemplatesPolicy,
    TokensPolicy,
    UpstreamPolicy,
    key_digest,
    model_dump_for,
)

__all__ = [
    "ANONYMOUS_TENANT",
    "BASE_ROUTES",
    "CHECK_NAMES",
    "ENV_PREFIX",
    "ENV_SEPARATOR",
    "BodyLimits",
    "ChatTemplatePolicy",
    "FanoutPolicy",
    "GuidedPolicy",
    "JsonPolicy",
    "KeyEntry",
    "LimitsPolicy",
    "MultimodalPolicy",
    "ObservabilityPolicy",
    "Policy",
    "PolicyError",
    "RateOverrides",
    "RatePolicy",
    "SchemaPolicy",
    "TemplatesPolicy",
    "TokensPolicy",
    "UpstreamPolicy",
    "default_policy",
    "key_digest",
    "load_policy",
    "policy_from_yaml",
    "policy_to_yaml",
]


def load_policy(path: str | None = None, env: Mapping[str, str] = os.environ) -> Policy:
    """The effective policy: ``path``'s YAML (defaults when ``None``), then ``env``'s
    ``SCHEDGUARD_*`` overrides; validated, with the tokenizer loaded once to prove it exists.

    Raises :class:`PolicyError` listing every problem found.
    """
    data = read_policy_file(path) if path is not None else {}
    origins = apply_env(data, env)
    policy = build_policy(data, origins, path)
    _check_tokenizer(policy, origins, path)
    return policy


def policy_from_yaml(text: str, env: Mapping[str, str] | None = None) -> Policy:
    """A policy from YAML text (and optional environment overrides); for tests and tools."""
    data = parse_yaml(text, "<yaml>")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(["the policy must be a YAML mapping"], "<yaml>")
    origins = apply_env(data, env or {})
    policy = build_policy(data, origins, "<yaml>")
    _check_tokenizer(policy, origins, "<yaml>")
    return policy


def default_policy() -> Policy:
    """The defaults, ignoring the environment."""
    return _DEFAULT


_DEFAULT = Policy()


def _check_tokenizer(policy: Policy, origins: Mapping[str, str], source: str | None) -> None:
    from guard.tokens import get_counter

    spec = policy.limits.tokens.tokenizer
    try:
        get_counter(spec)
    except Exception as exc:
        var = origins.get("limits.tokens.tokenizer")
        where = f" (from {var})" if var else ""
        raise PolicyError(
            [f"limits.tokens.tokenizer: cannot load {spec[:200]!r}: {str(exc)[:300]}{where}"],
            source,
        ) from None


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def policy_to_yaml(policy: Policy, *, reveal_secrets: bool = False) -> str:
    """The policy as YAML, every field present, in the models' order.

    API keys appear as ``key_sha256`` (loadable again) and a Redis password as ``***`` unless
    ``reveal_secrets``.
    """
    data: dict[str, Any] = model_dump_for(policy)
    keys = []
    for entry, dumped in zip(policy.keys, data["keys"], strict=True):
        if reveal_secrets and entry.key is not None:
            dumped["key"] = entry.key.get_secret_value()
            dumped.pop("key_sha256", None)
        else:
            dumped.pop("key", None)
            dumped["key_sha256"] = entry.digest
        # Only the overrides actually set, so that the output loads back to the same policy.
        dumped["rate"] = {k: dumped["rate"][k] for k in entry.rate.model_fields_set}
        keys.append({k: dumped[k] for k in ("key", "key_sha256", "tenant", "rate") if k in dumped})
    data["keys"] = keys
    redis_url = data["rate"].get("redis_url")
    if redis_url and not reveal_secrets:
        data["rate"]["redis_url"] = _redact_url(redis_url)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def _main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        from guard._policy_docs import policy_reference

        sys.stdout.write(policy_reference())
        return 0
    if argv == ["--yaml"] or not argv:
        sys.stdout.write(policy_to_yaml(default_policy()))
        return 0
    sys.stderr.write("usage: python -m guard.policy [--markdown | --yaml]\n")
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main(sys.argv[1:]))
