"""guard.checks.templates: prompt templates through their variables, request chat templates."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.checks import CheckResult, check_templates
from guard.errors import GuardError, PolicyError
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.prompt._placeholders import bound_expansion, parse_source
from guard.request import RequestView
from guard.template_scan import scan_template
from tests._support import peak_allocated

P = default_policy()
ALLOW = policy_from_yaml("limits: {templates: {allow_request_chat_template: true}}")
SCAN_ONLY = policy_from_yaml(
    "limits: {templates: {allow_request_chat_template: true, render_request_chat_template: false}}"
)
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
SEED = "{{" * 1024 + "system_prompt}}" * 512
# A real (simplified) chat template.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def run(body: Any, policy: Policy = P, path: str = CHAT) -> CheckResult:
    return check_templates(RequestView.build(body, path=path), policy)


def rejection(body: Any, policy: Policy = P, path: str = CHAT) -> GuardError:
    result = run(body, policy, path)
    assert result.rejection is not None, "expected a rejection"
    return result.rejection


def passes(body: Any, policy: Policy = P, path: str = CHAT) -> bool:
    return run(body, policy, path).rejection is None


def nested(depth: int) -> str:
    return "{{" * depth + "x" + "}}" * depth


# -- prompt templates ---------------------------------------------------------------------------


def test_seed_payload_is_refused_quickly() -> None:
    err, peak = peak_allocated(lambda: rejection({"prompt_template": SEED}, path="/v1/completions"))
    assert peak < 4 << 20, peak  # refused before anything was expanded
    assert err.code == "template_depth_exceeded"
    assert err.param == "prompt_template"


def test_depth_at_and_over_the_limit() -> None:
    assert passes({"prompt_template": nested(8)})
    assert rejection({"prompt_template": nested(9)}).code == "template_depth_exceeded"
    assert passes({"template_vars": {"a": nested(8)}})
    err = rejection({"template_vars": {"a": "ok", "b": nested(9)}})
    assert err.code == "template_depth_exceeded"
    assert err.param == "template_vars.b"


def test_unbalanced_delimiters() -> None:
    for text in ("{{a", "a}}", "{{a}}}}", "{{{{a}}"):
        assert rejection({"prompt_template": text}).code == "template_unbalanced", text
    assert rejection({"template_vars": {"v": "x}}"}}).param == "template_vars.v"


def test_benign_templates_pass() -> None:
    assert passes(
        {
            "prompt_template": "Hello {{ name }}, translate: {{text}}",
            "template_vars": {"name": "Ada", "text": "if (x) { y = {a: 1}; } // {braces}"},
        }
    )
    # Values are templates too: a literal "}}" (nested JSON's end) is a stray closer, refused
    # as the hardened scheduler refuses it; "} }" is the way to write it.
    assert rejection({"template_vars": {"t": "{'a': {1: 2}}"}}).code == "template_unbalanced"
    assert passes({"template_vars": {"t": "{'a': {1: 2} }"}})
    # Braces that are not delimiters are text: code, JSON, single braces.
    assert passes({"prompt_template": 'JSON: { "a": { "b": 1 } } and {x} and { {{y}} }'})
    # Placeholders built from placeholders.
    assert passes(
        {
            "prompt_template": "{{ {{lang}}_greeting }}",
            "template_vars": {"lang": "en", "en_greeting": "Hello"},
        }
    )
    # Template fields elsewhere are not looked at: messages may hold anything.
    assert passes({"messages": [{"role": "user", "content": SEED}]})


def test_types() -> None:
    assert rejection({"prompt_template": 5}).code == "invalid_type"
    assert rejection({"template_vars": ["a"]}).code == "invalid_type"
    assert rejection({"template_vars": {"a": 1}}).param == "template_vars.a"


def test_self_reference_is_refused() -> None:
    err = rejection({"prompt_template": "{{a}}", "template_vars": {"a": "x{{a}}"}})
    assert err.code == "template_depth_exceeded"
    assert err.param == "template_vars.a"
    cycle = {"a": "{{b}}", "b": "{{c}}", "c": "{{a}}"}
    assert rejection({"prompt_template": "{{a}}", "template_vars": cycle}).code == (
        "template_depth_exceeded"
    )


def test_depth_counts_through_variables() -> None:
    # A chain of 8 variables: the 8th is expanded at depth 8, fine.
    chain = {f"v{i}": f"{{{{v{i + 1}}}}}" for i in range(1, 8)} | {"v8": "end"}
    assert passes({"prompt_template": "{{v1}}", "template_vars": chain})
    # One more link is depth 9.
    chain9 = {f"v{i}": f"{{{{v{i + 1}}}}}" for i in range(1, 9)} | {"v9": "end"}
    assert rejection({"prompt_template": "{{v1}}", "template_vars": chain9}).code == (
        "template_depth_exceeded"
    )


def billion_laughs(fanout: int, levels: int) -> dict[str, Any]:
    variables = {f"a{i}": f"{{{{a{i + 1}}}}}" * fanout for i in range(levels)}
    variables[f"a{levels}"] = "lol"
    return {"prompt_template": "{{a0}}", "template_vars": variables}


def test_billion_laughs_is_refused_without_expanding() -> None:
    body = billion_laughs(10, 7)  # 10**7 * 3 characters
    err, peak = peak_allocated(lambda: rejection(body))
    assert peak < 4 << 20, peak
    assert err.code == "template_expansion_exceeded"


def test_expansion_at_and_over_the_limit() -> None:
    limit = P.limits.templates.max_expansion_chars
    body = {"prompt_template": "{{a}}" * 4, "template_vars": {"a": "x" * (limit // 4)}}
    assert passes(body)
    body = {"prompt_template": "{{a}}" * 4 + "!", "template_vars": {"a": "x" * (limit // 4)}}
    assert rejection(body).code == "template_expansion_exceeded"
    result = run(billion_laughs(4, 3))
    assert result.rejection is None
    assert result.costs["template_expansion_chars"] == 4**3 * 3
    assert result.costs["template_expansions"] == 1 + 4 + 16 + 64


def test_placeholder_count_at_and_over_the_limit() -> None:
    few = policy_from_yaml("limits: {templates: {max_expansions: 21}}")
    assert passes(billion_laughs(4, 2), few)  # 1 + 4 + 16 placeholders
    assert rejection(billion_laughs(4, 2) | {"prompt_template": "{{a0}}{{x}}"}, few).code == (
        "template_expansion_exceeded"
    )


def test_dynamic_names_take_the_worst_variable() -> None:
    body = billion_laughs(10, 6)
    body["prompt_template"] = "{{ {{pick}} }}"
    body["template_vars"]["pick"] = "a0"
    assert rejection(body).code == "template_expansion_exceeded"


def test_placeholder_bounds_directly() -> None:
    source = parse_source("ab{{x}}cd{{ {{y}}z }}e")
    assert source.literal == 5
    assert source.max_depth == 2
    assert source.refs == ((1, "x", 1), (2, "y", 1), (1, None, 1))
    assert parse_source("{{a}}{{b}}{{a}}").refs == ((1, "a", 2), (1, "b", 1))
    variables = {"x": parse_source("xxx"), "y": parse_source("q")}
    bound = bound_expansion(source, variables, 8, 10**6)
    assert bound.too_deep is None
    assert bound.size == 5 + 3 + 3  # the dynamic name may be the longest variable
    assert bound.expansions == 3


# -- chat templates -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, "/v1/completions", "/v1/responses", "/tokenize", "/x"])
def test_request_chat_template_is_refused_on_any_endpoint(path: str) -> None:
    err = rejection({"messages": MSG, "chat_template": CHATML}, path=path)
    assert err.code == "chat_template_not_allowed"
    assert err.param == "chat_template"
    smuggled = {"messages": MSG, "chat_template_kwargs": {"chat_template": CHATML}}
    err = rejection(smuggled, path=path)
    assert err.code == "chat_template_not_allowed"
    assert err.param == "chat_template_kwargs.chat_template"


def test_chat_template_kwargs_allowlist() -> None:
    assert passes({"messages": MSG, "chat_template_kwargs": {"enable_thinking": False}})
    err = rejection({"messages": MSG, "chat_template_kwargs": {"tokenize": True}})
    assert err.code == "chat_template_kwarg_not_allowed"
    assert err.param == "chat_template_kwargs.tokenize"
    assert rejection({"chat_template_kwargs": {"messages": []}}).code == (
        "chat_template_kwarg_not_allowed"
    )
    assert rejection({"chat_template_kwargs": "x"}).code == "invalid_type"
    custom = policy_from_yaml("limits: {templates: {chat_template_kwargs_allowlist: [foo]}}")
    assert passes({"chat_template_kwargs": {"foo": 1}}, custom)
    assert rejection({"chat_template_kwargs": {"enable_thinking": 1}}, custom).code == (
        "chat_template_kwarg_not_allowed"
    )


def test_allowed_chat_template_is_rendered_in_the_sandbox() -> None:
    result = run({"messages": MSG, "chat_template": CHATML}, ALLOW)
    assert result.rejection is None
    assert 0 < result.costs["chat_template_prompt_tokens"] < 50
    result = run({"messages": MSG, "chat_template_kwargs": {"chat_template": CHATML}}, ALLOW)
    assert result.rejection is None


@pytest.mark.parametrize(
    ("template", "codes"),
    [
        (
            "{% for a in range(99999) %}{% for b in range(99999) %}x{% endfor %}{% endfor %}",
            {"chat_template_value_too_large", "chat_template_loop_budget_exceeded"},
        ),
        ("{{ 'A' * 10**10 }}", {"chat_template_value_too_large"}),
        ("{{ 10**(10**7) }}", {"chat_template_value_too_large"}),
        ("{{ 'x'|center(10**9) }}", {"chat_template_value_too_large"}),
        ("{% for m in messages %}", {"chat_template_invalid"}),
        ("{{ ''.__class__.__mro__ }}", {"chat_template_security", "chat_template_render_failed"}),
        ("x" * 70_000, {"chat_template_too_large"}),
    ],
)
def test_hostile_chat_templates_are_refused_when_allowed(template: str, codes: set[str]) -> None:
    err, peak = peak_allocated(
        lambda: rejection({"messages": MSG, "chat_template": template}, ALLOW)
    )
    assert peak < 64 << 20, peak  # refused within the render's budgets
    assert err.code in codes, (err.code, err.message)
    assert err.param == "chat_template"


def test_rendered_prompt_is_capped_in_tokens() -> None:
    # Without a prompt cap, the context window bounds the render.
    window = ALLOW.limits.tokens.context_length
    assert window is not None
    long = [{"role": "user", "content": "word " * (window + 100)}]
    err = rejection({"messages": long, "chat_template": CHATML}, ALLOW)
    assert err.code == "context_length_exceeded"
    fits = [{"role": "user", "content": "word " * (window // 2)}]
    assert passes({"messages": fits, "chat_template": CHATML}, ALLOW)
    # With one (the seed preset's 2048), the cap.
    seeded = policy_from_yaml(
        "{preset: seed, limits: {templates: {allow_request_chat_template: true}}}"
    )
    err = rejection({"messages": fits, "chat_template": CHATML}, seeded)
    assert err.code == "prompt_tokens_exceeded"


def test_scan_only_mode_compiles_but_does_not_render() -> None:
    body = {"messages": MSG, "chat_template": "{% for a in range(99999) %}x{% endfor %}"}
    assert passes(body, SCAN_ONLY)
    assert rejection({"chat_template": "{% if %}"}, SCAN_ONLY).code == "chat_template_invalid"
    err = rejection({"chat_template_kwargs": {"chat_template": 5}}, SCAN_ONLY)
    assert err.code == "chat_template_invalid"
    assert err.param == "chat_template_kwargs.chat_template"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["{{", "}}", "{", "}", "a", " ", "\n", "é"]), max_size=16))
def test_flat_placeholders_read_in_one_pass_agree_with_the_general_reader(parts: list[str]) -> None:
    text = "".join(parts)
    if scan_template(text).error_code is not None:
        return  # parse_source reads balanced text only
    # A weigh other than len takes the general path (runs of literal text measured one by one).
    assert parse_source(text) == parse_source(text, weigh=lambda run: len(run))


# -- chat_template_kwargs -------------------------------------------------------------------------

LLAMA31_HEAD = (
    "{{- bos_token }}{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}"
    "{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}"
    "{%- endif %}{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{{ date_string }}{% if my_switch %}on{% endif %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)


def kwargs_body(**kwargs: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, "chat_template_kwargs": kwargs}


def test_common_template_switches_pass_without_a_template() -> None:
    body = kwargs_body(
        tools_in_user_message=False,
        date_string="07 Dec 2026",
        enable_thinking=False,
        citation_mode="accurate",
        controls={"citations": True, "length": "short"},
        builtin_tools=["brave_search", "wolfram_alpha"],
        documents=[{"title": "a", "text": "word " * 5000}],  # content: counted, not capped here
    )
    assert passes(body)
    # A key no common template reads is refused while the template is unknown.
    err = rejection(kwargs_body(my_switch=True))
    assert err.code == "chat_template_kwarg_not_allowed"
    assert err.param == "chat_template_kwargs.my_switch"


def test_the_variables_the_upstreams_template_reads_are_accepted(tmp_path: Any) -> None:
    template = tmp_path / "chat_template.jinja"
    template.write_text(LLAMA31_HEAD)
    policy = policy_from_yaml(f"limits: {{tokens: {{chat_template: '{template}'}}}}")
    assert passes(kwargs_body(my_switch=True), policy=policy)
    assert passes(kwargs_body(custom_tools=[{"name": "x"}]), policy=policy)
    err = rejection(kwargs_body(other_switch=True), policy=policy)
    assert "not read by the upstream's chat template" in err.message
    # Reading from the template can be turned off: the allowlist alone decides.
    only = policy_from_yaml(
        f"limits: {{tokens: {{chat_template: '{template}'}}, "
        "templates: {chat_template_kwargs_from_template: false}}"
    )
    assert rejection(kwargs_body(my_switch=True), policy=only).code == (
        "chat_template_kwarg_not_allowed"
    )


@pytest.mark.parametrize(
    "name", ["tokenize", "messages", "bos_token", "tools", "truncation", "raise_exception"]
)
def test_reserved_names_are_refused_even_when_the_template_reads_them(
    name: str, tmp_path: Any
) -> None:
    template = tmp_path / "chat_template.jinja"
    template.write_text(
        "{{ bos_token }}{{ raise_exception }}{{ tools }}{{ truncation }}" + LLAMA31_HEAD
    )
    policy = policy_from_yaml(f"limits: {{tokens: {{chat_template: '{template}'}}}}")
    err = rejection(kwargs_body(**{name: True}), policy=policy)
    assert err.code == "chat_template_kwarg_not_allowed"
    assert "is never accepted" in err.message
    # ... nor may they be allowlisted.
    with pytest.raises(PolicyError, match="may not be allowlisted"):
        policy_from_yaml(f"limits: {{templates: {{chat_template_kwargs_allowlist: [{name}]}}}}")


def test_kwarg_values_are_bounded_together() -> None:
    cap = P.limits.templates.max_chat_template_kwargs_bytes
    assert passes(kwargs_body(date_string="x" * (cap // 2)))
    err = rejection(kwargs_body(date_string="x" * cap, model_identity="y" * 10))
    assert err.code == "chat_template_kwarg_not_allowed"
    assert f"larger than {cap} bytes" in err.message
