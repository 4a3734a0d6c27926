"""guard.policy: defaults, YAML, SCHEDGUARD_* overrides, validation messages, show, docs."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from guard.admission import ConcurrencyLimits, RateLimits
from guard.checks import CHECK_NAMES
from guard.guided import GuidedLimits
from guard.http import FramingLimits, UpstreamConfig
from guard.jinja import ChatTemplateLimits
from guard.json import JsonLimits
from guard.policy import (
    KeyEntry,
    Policy,
    PolicyError,
    default_policy,
    key_digest,
    load_policy,
    policy_from_yaml,
    policy_to_yaml,
)
from guard.policy._docs import BEGIN, END, iter_fields, policy_reference
from tests._support import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "POLICY.md"


def problems(text: str = "", env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(text, env)
    return info.value.problems


# -- defaults -----------------------------------------------------------------------------------


def test_defaults_are_the_documented_ones() -> None:
    p = load_policy(None, env={})
    assert p == default_policy()
    # Prompt and output bounded by the context window only; nothing injected.
    assert p.preset == "default"
    assert p.limits.tokens.max_prompt_tokens is None
    assert p.limits.tokens.max_output_tokens is None
    assert p.limits.tokens.default_max_tokens is None
    assert p.limits.templates.max_depth == 8
    assert p.limits.templates.allow_request_chat_template is False
    assert "tokenize" not in p.limits.templates.chat_template_kwargs_allowlist
    assert "tools_in_user_message" in p.limits.templates.chat_template_kwargs_allowlist
    # Published API limits (OpenAI's).
    assert p.limits.fanout.max_best_of == 20
    assert p.limits.fanout.max_top_logprobs == 20
    assert p.limits.fanout.max_n == 128
    assert p.limits.schema_.unknown_fields == "allow"
    assert p.keys == ()
    assert p.routes == ()
    assert p.checks == CHECK_NAMES
    assert p.observability.log_prompts is False
    assert p.rate.on_redis_failure == "closed"
    assert "/v1/chat/completions" in p.allowed_routes
    assert "/v1/responses" not in p.allowed_routes


def test_policy_is_immutable() -> None:
    p = default_policy()
    with pytest.raises(ValueError):
        p.limits.tokens.max_prompt_tokens = 1


def test_limit_sets_are_the_policy_sections() -> None:
    # Declared once, next to the code that reads them: the policy holds those objects.
    p = default_policy()
    assert type(p.limits.body) is FramingLimits and p.limits.body == FramingLimits()
    assert type(p.limits.json_) is JsonLimits and p.limits.json_ == JsonLimits()
    assert type(p.limits.guided) is GuidedLimits and p.limits.guided == GuidedLimits()
    assert type(p.upstream) is UpstreamConfig and p.upstream == UpstreamConfig()
    assert isinstance(p.rate, RateLimits)
    assert isinstance(p.limits.templates.chat_template, ChatTemplateLimits)


def test_chat_template_section_is_the_sandbox_limits_with_the_guards_deadline() -> None:
    section = dataclasses.asdict(default_policy().limits.templates.chat_template)
    library = dataclasses.asdict(ChatTemplateLimits())
    assert section.keys() == library.keys()
    # The guard renders under the hardened scheduler's deadline, not the library's 1 s.
    assert section.pop("deadline_s") == 0.25
    assert library.pop("deadline_s") == 1.0
    assert section == library


def test_limit_objects_read_by_the_guard() -> None:
    p = policy_from_yaml(
        "limits: {body: {max_body_bytes: 1000, content_encoding: inflate, max_inflated_bytes: 5000},"
        " json: {max_depth: 10}}"
    )
    assert p.limits.body.largest_body == 5000
    assert p.limits.json_.max_depth == 10
    assert p.limits.guided == GuidedLimits()
    assert p.limits.templates.chat_template.deadline_s == 0.25
    assert p.rate.slot_limits == ConcurrencyLimits(64, 256)


# -- YAML ---------------------------------------------------------------------------------------


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "upstream:\n  url: http://127.0.0.1:8000/\n"
        "routes: [/v1/responses, /tokenize]\n"
        "limits:\n  tokens:\n    max_prompt_tokens: 4096\n    context_length: 8192\n"
        "  schema:\n    unknown_fields: reject\n"
    )
    p = load_policy(str(path), env={})
    assert p.upstream.url == "http://127.0.0.1:8000"
    assert p.routes == ("/v1/responses", "/tokenize")
    assert "/tokenize" in p.allowed_routes
    assert p.limits.tokens.max_prompt_tokens == 4096
    assert p.limits.schema_.unknown_fields == "reject"


def test_empty_yaml_is_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_policy(str(path), env={}) == default_policy()


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(str(tmp_path / "nope.yaml"), env={})
    assert "not valid YAML" in problems("limits: [")[0]
    assert problems("- a\n- b\n") == ["the policy must be a YAML mapping"]


def test_a_yaml_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("limits:\n  tokens:\n    max_prompt_tokens: [1, 2\nrate: {\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(str(path), env={})
    (problem,) = exc.value.problems
    assert problem.startswith(f"not valid YAML: {path}, line 4, column 5: expected ',' or ']'")
    assert "from line 3, column 24" in problem  # where the unclosed list began
    assert "<unicode string>" not in problem and "\n" not in problem


def test_a_duplicate_key_is_placed_at_its_second_occurrence(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rate:\n  rpm: 1\nrate:\n  rpm: 2\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(str(path), env={})
    assert exc.value.problems == [f"not valid YAML: {path}, line 3, column 1: duplicate key 'rate'"]


def test_duplicate_yaml_keys_are_refused() -> None:
    (problem,) = problems(
        "limits:\n  tokens:\n    max_prompt_tokens: 1\n    max_prompt_tokens: 2\n"
    )
    assert "duplicate key 'max_prompt_tokens'" in problem


# -- validation messages -----------------------------------------------------------------------


def test_errors_name_the_field() -> None:
    found = problems(
        "limits:\n  tokens: {max_prompt_tokens: 0}\n  fanout: {max_n: -1, max_best_of: x}\n"
        "upstream: {connect_timeout_s: 0}\n"
    )
    assert "limits.tokens.max_prompt_tokens: must be > 0" in found
    assert "limits.fanout.max_n: must be > 0" in found
    assert "limits.fanout.max_best_of: must be an integer" in found
    assert "upstream.connect_timeout_s: must be > 0" in found


def test_message_lists_every_problem() -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml("limits: {tokens: {max_prompt_tokens: 0, max_output_tokens: 0}}")
    text = str(info.value)
    assert text.startswith("invalid policy")
    assert "\n  limits.tokens.max_prompt_tokens: must be > 0" in text
    assert "\n  limits.tokens.max_output_tokens: must be > 0" in text


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "limits: {tokens: {max_promt_tokens: 1}}",
            "limits.tokens.max_promt_tokens: unknown field",
        ),
        ("limitz: {}", "limitz: unknown field"),
        (
            "limits: {body: {content_encoding: gzip}}",
            "limits.body.content_encoding: must be one of",
        ),
        ("limits: {tokens: 5}", "limits.tokens: must be a mapping"),
        ("limits: {tokens: {max_prompt_tokens: 2.5}}", "limits.tokens.max_prompt_tokens: must be"),
        ("limits: {tokens: {max_prompt_tokens: '12'}}", "limits.tokens.max_prompt_tokens: must be"),
        ("limits: {tokens: {max_prompt_tokens: true}}", "limits.tokens.max_prompt_tokens: must be"),
        ("limits: {json: {max_depth: 129}}", "limits.json.max_depth: must be <= 128"),
        ("limits: {templates: {max_depth: 0}}", "limits.templates.max_depth: must be >= 1"),
        ("upstream: {url: 'ftp://x'}", "upstream.url: must be an http:// or https:// URL"),
        ("routes: ['v1/x']", "routes: 'v1/x' must be a plain absolute path"),
        ("routes: ['/guard/v1/check']", "routes: '/guard/v1/check' is the guard's own path"),
        ("checks: [schema, nope]", "checks: unknown check 'nope'"),
        ("checks: [schema, schema]", "checks: a check is listed twice"),
        ("rate: {redis_url: 'http://x'}", "rate.redis_url: must be a redis://"),
        ("rate: {on_redis_failure: maybe}", "rate.on_redis_failure: must be one of"),
        (
            "limits: {templates: {chat_template_kwargs_allowlist: [tokenize]}}",
            "limits.templates.chat_template_kwargs_allowlist: 'tokenize' may not be allowlisted",
        ),
        (
            "limits: {tokens: {default_max_tokens: 4000, max_output_tokens: 3000}}",
            "limits.tokens: default_max_tokens must be <= max_output_tokens",
        ),
        (
            "{preset: seed, limits: {tokens: {context_length: 256}}}",
            "limits.tokens: default_max_tokens must be < context_length",
        ),
        ("keys: [{tenant: a}]", "keys[0]: set exactly one of key and key_sha256"),
        ("keys: [{key: short, tenant: a}]", "keys[0].key: must be 8 to 256 printable"),
        ("keys: [{key: abcdefghij, tenant: 'a b'}]", "keys[0].tenant: must be 1 to 64"),
        ("keys: [{key_sha256: abc, tenant: a}]", "keys[0].key_sha256: must be 64 hexadecimal"),
        ("keys: [{key: abcdefghij}]", "keys[0].tenant: required"),
        (
            "keys: [{key: abcdefghij, tenant: a}, {key: abcdefghij, tenant: b}]",
            "(policy): keys[1] repeats the key of keys[0]",
        ),
        (
            "keys: [{key: abcdefghij, tenant: a, rate: {burst: 0}}]",
            "keys[0].rate.burst: must be > 0",
        ),
    ],
)
def test_validation_messages(yaml_text: str, expected: str) -> None:
    found = problems(yaml_text)
    assert any(p.startswith(expected) for p in found), found


def test_unknown_tokenizer_is_refused_at_load() -> None:
    (problem,) = problems("limits: {tokens: {tokenizer: /nonexistent/tokenizer.json}}")
    assert problem.startswith("limits.tokens.tokenizer: cannot load")


# -- environment --------------------------------------------------------------------------------


def test_env_overrides_nested_fields(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("limits: {tokens: {max_prompt_tokens: 1000}}\n")
    env = {
        "SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS": "4096",
        "SCHEDGUARD_LIMITS__TEMPLATES__ALLOW_REQUEST_CHAT_TEMPLATE": "true",
        "SCHEDGUARD_ROUTES": '["/v1/responses"]',
        "SCHEDGUARD_UPSTREAM__URL": "http://upstream:9000",
        "SCHEDGUARD_RATE__REDIS_URL": "redis://localhost:6379/0",
        "schedguard_limits__fanout__max_n": "4",
        "SCHEDGUARD_LIMITS__TOKENS__CONTEXT_LENGTH": "null",
        "SCHEDGUARD_POLICY": "/somewhere/else.yaml",  # not a policy field: ignored
        "OTHER_VAR": "x",
    }
    p = load_policy(str(path), env=env)
    assert p.limits.tokens.max_prompt_tokens == 4096
    assert p.limits.templates.allow_request_chat_template is True
    assert p.routes == ("/v1/responses",)
    assert p.upstream.url == "http://upstream:9000"
    assert p.rate.redis_url == "redis://localhost:6379/0"
    assert p.limits.fanout.max_n == 4
    assert p.limits.tokens.context_length is None


def test_env_keys_as_yaml() -> None:
    digest = key_digest("secret-key-1")
    env = {"SCHEDGUARD_KEYS": f"[{{key_sha256: {digest}, tenant: team-a}}]"}
    p = load_policy(None, env=env)
    assert p.keys[0].tenant == "team-a"
    assert p.keys_by_digest[digest].tenant == "team-a"


def test_env_errors_name_the_variable() -> None:
    found = problems("", {"SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS": "-5"})
    assert found == [
        "limits.tokens.max_prompt_tokens: must be > 0 (from SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS)"
    ]
    # A name that is no field's is refused before anything is read, with the closest valid
    # variable: by its spelling with other underscores first, else by edit distance.
    unknown = "not a variable schedguard reads"
    for given, meant in (
        (
            "SCHEDGUARD_LIMITS__TOKENS__MAX_PROMT_TOKENS",
            "SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS",
        ),
        ("SCHEDGUARD_LIMITZ__TOKENS", "SCHEDGUARD_LIMITS__TOKENS"),
        ("SCHEDGUARD_UPSTREAM_URL", "SCHEDGUARD_UPSTREAM__URL"),
        ("SCHEDGUARD_LIMITS_FANOUT_MAX_N", "SCHEDGUARD_LIMITS__FANOUT__MAX_N"),
        ("schedguard_upstream_url", "SCHEDGUARD_UPSTREAM__URL"),
        ("SCHEDGUARD_POLICY_FILE", "SCHEDGUARD_POLICY"),
    ):
        found = problems("", {given: "5"})
        assert found == [
            f"{given}: {unknown} (policy overrides are SCHEDGUARD_ + the field's "
            f"path joined by __); did you mean {meant}?"
        ], found
    # Every unknown name at once, and nothing close: no suggestion.
    found = problems("", {"SCHEDGUARD_A": "1", "SCHEDGUARD_ZZZZZZZZZZZZZ": "2"})
    assert len(found) == 2 and all("did you mean" not in line for line in found)


def test_env_path_through_a_scalar_is_an_error() -> None:
    # routes is a list: no field below it, so no variable either.
    found = problems("", {"SCHEDGUARD_ROUTES__X": "1"})
    assert found[0].startswith("SCHEDGUARD_ROUTES__X: not a variable schedguard reads")
    found = problems("", {"SCHEDGUARD_LIMITS____X": "1"})
    assert found[0].startswith("SCHEDGUARD_LIMITS____X: not a variable schedguard reads")
    # A section set whole from a scalar is the section's type error.
    found = problems("", {"SCHEDGUARD_LIMITS__TOKENS": "5"})
    assert found == ["limits.tokens: must be a mapping (from SCHEDGUARD_LIMITS__TOKENS)"]


def test_every_policy_field_has_a_variable() -> None:
    from guard.policy import OTHER_VARIABLES, policy_variables

    variables = policy_variables()
    assert variables["SCHEDGUARD_UPSTREAM__URL"] == ("upstream", "url")
    assert variables["SCHEDGUARD_LIMITS__JSON__MAX_DEPTH"] == ("limits", "json", "max_depth")
    assert variables["SCHEDGUARD_PRESET"] == ("preset",)
    assert not set(variables) & set(OTHER_VARIABLES)


# -- keys and rates -----------------------------------------------------------------------------


def test_keys_are_found_by_digest() -> None:
    p = policy_from_yaml(
        "keys:\n  - {key: first-key-123, tenant: a}\n"
        f"  - {{key_sha256: {hashlib.sha256(b'second-key-456').hexdigest().upper()}, tenant: b}}\n"
    )
    assert p.keys_by_digest[key_digest("first-key-123")].tenant == "a"
    assert p.keys_by_digest[key_digest("second-key-456")].tenant == "b"
    assert "first-key-123" not in repr(p)


def test_rate_overrides_inherit_what_they_leave_out() -> None:
    p = policy_from_yaml(
        "rate: {requests_per_minute: 100, tokens_per_minute: 5000, burst: 7}\n"
        "keys:\n"
        "  - {key: key-aaaaaaaa, tenant: a, rate: {requests_per_minute: 10}}\n"
        "  - {key: key-bbbbbbbb, tenant: b, rate: {tokens_per_minute: null, burst: null}}\n"
        "  - {key: key-cccccccc, tenant: c}\n"
    )
    a, b, c = p.keys
    assert p.rate_for(a).requests_per_minute == 10
    assert p.rate_for(a).tokens_per_minute == 5000
    assert p.rate_for(b).tokens_per_minute is None  # explicitly unlimited
    assert p.rate_for(b).burst == 7  # burst cannot be unlimited: null inherits
    assert p.rate_for(c) == p.rate
    # The anonymous tenant (no key) has rate.anonymous's limits: unlimited by default.
    assert p.rate_for(None).requests_per_minute is None
    assert p.rate_for(None).tokens_per_minute is None


def test_the_default_policy_does_not_throttle_one_anonymous_client() -> None:
    """Issue 14 item 6: without keys, no request or token rate, and the global concurrency."""
    p = default_policy()
    anonymous = p.rate_for(None)
    assert anonymous.requests_per_minute is None and anonymous.tokens_per_minute is None
    assert anonymous.per_key_concurrency == p.rate.global_concurrency == 256
    # Keys keep per-tenant rates by default.
    keyed = policy_from_yaml("keys: [{key: key-aaaaaaaa, tenant: a}]")
    assert keyed.rate_for(keyed.keys[0]).requests_per_minute == 600
    assert keyed.rate_for(keyed.keys[0]).per_key_concurrency == 64


def test_anonymous_limits_apply_when_the_policy_asks() -> None:
    p = policy_from_yaml(
        "rate: {burst: 9, global_concurrency: 100, anonymous: {requests_per_minute: 60, "
        "tokens_per_minute: 1000}}"
    )
    anonymous = p.rate_for(None)
    assert (anonymous.requests_per_minute, anonymous.tokens_per_minute) == (60, 1000)
    assert anonymous.burst == 9 and anonymous.per_key_concurrency == 100
    capped = policy_from_yaml("rate: {anonymous: {concurrency: 8, burst: 2}}").rate_for(None)
    assert capped.per_key_concurrency == 8 and capped.burst == 2
    assert capped.slot_limits.max_concurrent == 8


# -- show ---------------------------------------------------------------------------------------


def test_policy_to_yaml_round_trips_and_hides_secrets() -> None:
    p = policy_from_yaml(
        "rate: {redis_url: 'redis://user:hunter2@cache:6379/0'}\n"
        "keys:\n  - {key: my-secret-key, tenant: a, rate: {burst: 3}}\n"
        "routes: [/v1/responses]\n"
    )
    text = policy_to_yaml(p)
    assert "my-secret-key" not in text
    assert "hunter2" not in text
    assert key_digest("my-secret-key") in text
    assert "redis://user:***@cache:6379/0" in text
    again = policy_from_yaml(text.replace("user:***@", "user:hunter2@"))
    assert again.keys[0].digest == p.keys[0].digest
    assert again.rate_for(again.keys[0]) == p.rate_for(p.keys[0])
    assert again.routes == p.routes
    assert again.rate == p.rate


def test_policy_to_yaml_can_reveal() -> None:
    p = policy_from_yaml("keys: [{key: my-secret-key, tenant: a}]")
    text = policy_to_yaml(p, reveal_secrets=True)
    assert "my-secret-key" in text
    assert policy_from_yaml(text) == p


def test_default_policy_yaml_round_trips() -> None:
    text = policy_to_yaml(default_policy())
    assert "max_prompt_tokens: null" in text
    assert policy_from_yaml(text) == default_policy()
    seed = policy_from_yaml("preset: seed")
    text = policy_to_yaml(seed)
    assert "preset: seed" in text and "max_prompt_tokens: 2048" in text
    assert policy_from_yaml(text) == seed


def test_a_preset_lies_beneath_the_policys_own_values() -> None:
    seed = policy_from_yaml("preset: seed")
    assert seed.limits.tokens.max_prompt_tokens == 2048
    assert seed.limits.tokens.max_output_tokens == 2048
    assert seed.limits.tokens.default_max_tokens == 256
    assert seed.limits.fanout.max_top_logprobs == 5
    assert seed.limits.fanout.max_n == 16
    # A field the policy sets wins over the preset's, whether from the file or the
    # environment; the rest of the preset stays.
    mixed = policy_from_yaml(
        "{preset: seed, limits: {tokens: {max_prompt_tokens: 8000}}}",
        env={"SCHEDGUARD_LIMITS__FANOUT__MAX_N": "4"},
    )
    assert mixed.limits.tokens.max_prompt_tokens == 8000
    assert mixed.limits.tokens.default_max_tokens == 256
    assert mixed.limits.fanout.max_n == 4
    # The preset can come from the environment too.
    env = policy_from_yaml("", env={"SCHEDGUARD_PRESET": "seed"})
    assert env.preset == "seed" and env.limits.tokens.max_prompt_tokens == 2048
    with pytest.raises(PolicyError, match="preset: must be one of"):
        policy_from_yaml("preset: tight")


def test_key_entry_forms() -> None:
    entry = KeyEntry.model_validate({"key": "abcdefgh12", "tenant": "t"})
    assert entry.key_id == key_digest("abcdefgh12")[:12]
    assert "abcdefgh12" not in repr(entry)


# -- documentation ------------------------------------------------------------------------------


def test_every_field_has_a_description() -> None:
    missing = [f.path for f in iter_fields() if not f.description.strip()]
    assert not missing, missing


def test_every_field_is_documented_in_policy_md() -> None:
    text = DOCS.read_text()
    missing = [f.path for f in iter_fields() if f"`{f.path}`" not in text]
    assert not missing, f"undocumented in docs/POLICY.md: {missing}"


def test_policy_md_reference_is_up_to_date() -> None:
    text = DOCS.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] + "\n" == policy_reference(), (
        "docs/POLICY.md is stale: regenerate its reference with `python -m guard.policy "
        "--write docs/POLICY.md`"
    )


def test_policy_model_is_strict_about_extra_fields() -> None:
    with pytest.raises(ValueError):
        Policy.model_validate({"limits": {"tokens": {"bogus": 1}}})


def test_the_reference_is_written_between_the_markers(tmp_path: Path) -> None:
    import subprocess
    import sys

    from guard.policy._docs import BEGIN, END, policy_reference

    doc = tmp_path / "POLICY.md"
    doc.write_text(f"# Policy\n\nHand-written.\n\n{BEGIN}\nOUTDATED\n{END}\n\nAfter.\n")
    run = [sys.executable, "-m", "guard.policy", "--write", str(doc)]
    assert subprocess.run(run, capture_output=True, check=False).returncode == 0
    text = doc.read_text()
    assert text.startswith("# Policy\n\nHand-written.\n\n") and text.endswith(f"{END}\n\nAfter.\n")
    assert policy_reference().rstrip("\n") in text and "OUTDATED" not in text
    doc.write_text("no markers\n")
    failed = subprocess.run(run, capture_output=True, text=True, check=False)
    assert failed.returncode != 0 and "no generated part" in failed.stderr
    assert doc.read_text() == "no markers\n"
