"""An unknown policy field (a misspelling) names the closest known field, in a policy file and
in a ``SCHEDGUARD_*`` override alike."""

from __future__ import annotations

import pytest

from guard.policy import PolicyError, load_policy, policy_from_yaml
from guard.policy._load import suggest_field


def _problems(yaml_text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(yaml_text, env)
    return info.value.problems


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "limits: {tokens: {max_promt_tokens: 1}}",
            "limits.tokens.max_promt_tokens: unknown field; did you mean max_prompt_tokens?",
        ),
        ("limitz: {}", "limitz: unknown field; did you mean limits?"),
        ("limits: {jsn: {}}", "limits.jsn: unknown field; did you mean json?"),  # an alias
        ("upstream: {urll: 'http://x'}", "upstream.urll: unknown field; did you mean url?"),
        (
            "keys: [{key_sha256: '" + "0" * 64 + "', tenant: t, rat: {}}]",
            "keys[0].rat: unknown field; did you mean rate?",
        ),  # a section inside a list
        ("zzzz: 1", "zzzz: unknown field"),  # nothing close: no guess
    ],
)
def test_yaml_unknown_field_names_the_closest(yaml_text: str, expected: str) -> None:
    assert _problems(yaml_text) == [expected]


def test_env_override_names_the_variable_and_the_closest_field() -> None:
    var = "SCHEDGUARD_LIMITS__TOKENS__MAX_PROMT_TOKENS"
    with pytest.raises(PolicyError) as info:
        load_policy(None, {var: "5"})
    assert info.value.problems == [
        f"{var}: not a variable schedguard reads (policy overrides are SCHEDGUARD_ + the "
        "field's path joined by __); did you mean SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS?"
    ]


def test_suggest_field_is_total() -> None:
    assert suggest_field(()) is None
    assert suggest_field(("routes", 0)) is None  # not a field name
    assert suggest_field(("nosuchsection", "urll")) is None  # no section there
    assert suggest_field(("UPSTREAM",)) == "upstream"  # env variables are upper case
