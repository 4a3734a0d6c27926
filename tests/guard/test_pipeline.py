"""guard.pipeline: order as data, first rejection wins, costs and mutations, evaluate_body."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.checks import CHECKS, CheckResult, Mutation, apply_mutations
from guard.errors import GuardError
from guard.pipeline import CHECK_FAILED, Verdict, checks_for, evaluate_body, run_checks
from guard.policy import Policy, default_policy, key_digest, policy_from_yaml
from guard.request import RequestView, endpoint_of
from guard.routing import resolve_key

P = default_policy()
SEED = policy_from_yaml("preset: seed")  # injects max_tokens 256 when a request sets none
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
KEYED = policy_from_yaml(
    "keys:\n  - {key: alpha-key-1, tenant: team-a}\n"
    f"  - {{key_sha256: {key_digest('beta-key-22')}, tenant: team-b}}\n"
)


def evaluate(body: Any, path: str = CHAT, policy: Policy = P, **kw: Any) -> Verdict:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return evaluate_body(raw, path, kw.pop("headers", {}), policy, **kw)


def test_every_registered_check_runs_by_default_in_its_order() -> None:
    assert default_policy().checks == tuple(CHECKS)
    assert [name for name, _ in checks_for(P)] == list(P.checks)


def test_benign_request_is_allowed_with_costs_and_mutations() -> None:
    verdict = evaluate({"model": "m", "messages": MSG})
    assert verdict.allowed and verdict.status == 200 and verdict.code is None
    assert verdict.costs["body_bytes"] > 0
    assert verdict.costs["prompt_tokens"] > 0
    assert verdict.costs["tokens_reserved"] >= verdict.costs["output_tokens_reserved"] > 0
    assert verdict.mutations == ()  # forwarded as it is
    seeded = evaluate({"model": "m", "messages": MSG}, policy=SEED)
    assert seeded.mutations == (Mutation(("max_tokens",), 256, "default_max_tokens"),)
    assert list(verdict.durations) == ["parse", *P.checks]
    assert verdict.view is not None and verdict.view.tenant == "anonymous"


def test_counts_are_judged_before_the_schema_types_each_item() -> None:
    # 2,000 messages, the first of a role no upstream knows: the count (fan-out, O(1)) refuses
    # the body before the schema check walks the messages.
    body = {"model": "m", "messages": [{"role": "wizard", "content": "x"}] * 3000}
    verdict = evaluate(body)
    assert verdict.code == "messages_exceeded"
    assert "schema" not in verdict.durations
    # Within the count, the schema still types every message.
    body["messages"] = body["messages"][:3]
    assert evaluate(body).code == "invalid_value"


def test_forward_body_applies_mutations_only_when_needed() -> None:
    raw = json.dumps({"model": "m", "messages": MSG}).encode()
    verdict = evaluate_body(raw, CHAT, {}, SEED)
    forwarded = json.loads(verdict.forward_body(raw))
    assert forwarded["max_tokens"] == 256
    assert verdict.view is not None and "max_tokens" not in verdict.view.body
    raw = json.dumps({"model": "m", "messages": MSG, "max_tokens": 5}).encode()
    verdict = evaluate_body(raw, CHAT, {}, SEED)
    assert verdict.forward_body(raw) is raw


def test_apply_mutations_copies_only_the_path() -> None:
    body = {"a": {"b": 1}, "c": [1, 2]}
    out = apply_mutations(body, (Mutation(("a", "b"), 2, "x"), Mutation(("d",), 3, "y")))
    assert out == {"a": {"b": 2}, "c": [1, 2], "d": 3}
    assert body == {"a": {"b": 1}, "c": [1, 2]}
    assert out["c"] is body["c"]


def test_first_rejection_wins_and_stops() -> None:
    # n too large (fanout) and a refused chat template (templates): fanout runs first.
    body = {"messages": MSG, "n": 10**6, "chat_template": "x"}
    verdict = evaluate(body)
    assert verdict.code == "n_exceeded"
    assert "templates" not in verdict.durations
    # The order is data: templates first now.
    reordered = policy_from_yaml("checks: [templates, fanout]")
    assert evaluate(body, policy=reordered).code == "chat_template_not_allowed"
    # And a check left out does not run.
    only_schema = policy_from_yaml("checks: [schema]")
    verdict = evaluate(body, policy=only_schema)
    assert verdict.allowed and verdict.mutations == ()


def test_costs_are_kept_up_to_the_rejection() -> None:
    body = {"messages": MSG, "guided_regex": "(a+)+$"}
    verdict = evaluate(body)
    assert verdict.code == "guided_regex_unsafe"
    assert "prompt_tokens" in verdict.costs  # tokens ran before guided
    assert verdict.to_dict()["allowed"] is False


def test_a_crashing_check_fails_closed() -> None:
    def boom(view: RequestView, policy: Policy) -> CheckResult:
        raise ZeroDivisionError("bug")

    view = RequestView.build({"messages": MSG}, path=CHAT)
    verdict = run_checks(view, P, (("boom", boom), *checks_for(P)))
    assert not verdict.allowed
    assert verdict.code == CHECK_FAILED
    assert verdict.status == 400
    assert "boom" in verdict.durations and "schema" not in verdict.durations


def test_custom_check_sequence() -> None:
    def refuse(view: RequestView, policy: Policy) -> CheckResult:
        return CheckResult.rejected(GuardError("custom", "no"))

    verdict = run_checks(RequestView.build({}, path=CHAT), P, (("custom", refuse),))
    assert verdict.code == "custom"


def test_parse_errors_become_verdicts() -> None:
    assert evaluate(b"{").code == "invalid_json"
    assert evaluate(b"[" * 100_000).code == "json_depth_exceeded"
    assert evaluate(b'{"a": 1, "a": 2}').code == "json_duplicate_key"
    assert evaluate(b"\xff").code == "invalid_utf8"
    big = policy_from_yaml("limits: {body: {max_body_bytes: 100}}")
    verdict = evaluate({"messages": [{"role": "user", "content": "x" * 200}]}, policy=big)
    assert verdict.code == "body_too_large" and verdict.status == 413
    assert list(verdict.durations) == ["parse"]


def test_routes() -> None:
    verdict = evaluate({"prompt": "x"}, "/v1/responses")
    assert verdict.code == "route_not_allowed" and verdict.status == 404
    allowed = policy_from_yaml("routes: [/v1/responses, /tokenize]")
    assert evaluate({"input": "x"}, "/v1/responses", allowed).allowed
    assert evaluate({"prompt": "x"}, "/tokenize?x=1", allowed).allowed
    assert evaluate({"prompt": "x"}, "/v1/completions?stream=1").allowed
    models = evaluate_body(b"", "/v1/models", {}, P, method="GET")
    assert models.allowed and models.view is not None and models.view.body is None


def test_chat_template_refused_on_allowlisted_routes_too() -> None:
    allowed = policy_from_yaml("routes: [/v1/responses, /tokenize]")
    for path in ("/v1/responses", "/tokenize"):
        body = {"messages": MSG, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}
        assert evaluate(body, path, allowed).code == "chat_template_not_allowed"


def test_api_keys() -> None:
    body = {"messages": MSG}
    assert evaluate(body, policy=KEYED).code == "missing_api_key"
    assert evaluate(body, policy=KEYED).status == 401
    bad = {"authorization": "Bearer nope-nope"}
    assert evaluate(body, policy=KEYED, headers=bad).code == "invalid_api_key"
    basic = {"Authorization": "Basic abc"}
    assert evaluate(body, policy=KEYED, headers=basic).code == "invalid_api_key"
    good = evaluate(body, policy=KEYED, headers={"Authorization": "Bearer alpha-key-1"})
    assert good.allowed and good.view is not None
    assert good.view.tenant == "team-a"
    assert good.view.key_id == key_digest("alpha-key-1")[:12]
    pairs = [(b"authorization", b"bearer beta-key-22"), (b"x-request-id", b"r1")]
    verdict = evaluate(body, policy=KEYED, headers=pairs)
    assert verdict.view is not None and verdict.view.tenant == "team-b"
    assert verdict.view.headers == {"x-request-id": "r1"}
    twice = [("authorization", "Bearer alpha-key-1"), ("authorization", "Bearer beta-key-22")]
    assert evaluate(body, policy=KEYED, headers=twice).code == "invalid_api_key"
    # Auth comes before parsing: an unauthenticated caller's body is not read.
    assert evaluate(b"[" * 100_000, policy=KEYED).code == "missing_api_key"
    # Without keys, any header is fine and everyone is anonymous.
    assert resolve_key({"authorization": "Bearer whatever"}, P) is None


def test_view_basics() -> None:
    view = RequestView.build(
        {"a": 1},
        path="/v1/embeddings?x",
        method="post",
        headers={"User-Agent": "u" * 1000, "Cookie": "secret"},
        raw_size=7,
    )
    assert view.endpoint == "embeddings" and view.path == "/v1/embeddings"
    assert view.method == "POST" and view.raw_size == 7
    assert view.headers == {"user-agent": "u" * 256}
    assert view.obj == {"a": 1}
    assert RequestView.build([1], path="/x").obj is None
    assert endpoint_of("/tokenize") == "tokenize" and endpoint_of("/nope") == "other"


def test_dry_run_dict() -> None:
    verdict = evaluate({"messages": MSG, "n": 999})
    d = verdict.to_dict()
    assert d["allowed"] is False and d["status"] == 400
    assert d["code"] == "n_exceeded" and d["param"] == "n"
    assert set(d) == {
        "allowed",
        "status",
        "code",
        "message",
        "param",
        "costs",
        "mutations",
        "durations_ms",
    }
    json.dumps(d)
    ok = evaluate({"messages": MSG}, policy=SEED).to_dict()
    assert ok["mutations"] == [
        {"path": ["max_tokens"], "value": 256, "reason": "default_max_tokens"}
    ]


# -- never an exception ---------------------------------------------------------------------------

_PATHS = st.sampled_from(
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/responses"]
)
_OPEN = policy_from_yaml(
    "routes: [/v1/responses, /tokenize]\n"
    "limits: {templates: {allow_request_chat_template: true}, tokens: {context_length: 300}}"
)


def _check_verdict(verdict: Verdict) -> None:
    assert isinstance(verdict, Verdict)
    assert verdict.code != CHECK_FAILED, verdict.rejection
    if verdict.rejection is not None:
        assert verdict.rejection.code and verdict.rejection.status in (400, 401, 404, 408, 413)
        json.dumps(verdict.rejection.to_body())
    json.dumps(verdict.to_dict())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=512), path=_PATHS, method=st.sampled_from(["POST", "GET"]))
def test_arbitrary_bytes_give_a_verdict(raw: bytes, path: str, method: str) -> None:
    _check_verdict(evaluate_body(raw, path, {}, P, method=method))


_KEYS = st.sampled_from(
    [
        "model", "messages", "prompt", "input", "n", "best_of", "max_tokens",
        "max_completion_tokens", "n_predict", "logprobs", "top_logprobs", "prompt_logprobs",
        "min_tokens", "stop", "logit_bias", "tools", "prompt_template", "template_vars",
        "chat_template", "chat_template_kwargs", "guided_regex", "guided_json",
        "response_format", "structured_outputs", "role", "content", "type", "text",
        "image_url", "video_url", "input_audio", "url", "data", "function", "parameters",
        "instructions", "max_output_tokens", "suffix",
    ]
)  # fmt: skip
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(
        [
            "{{a}}",
            "{{",
            "}}",
            "data:image/png;base64,iVBORw0KGgo=",
            "data:video/jpeg;base64,AA==,AA==",
            "data:x",
            "(a+)+",
            "user",
            "text",
            "image_url",
            "{% for x in messages %}{{ x }}{% endfor %}",
            "file:///etc/passwd",
        ]
    ),
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(_KEYS, _JSON, max_size=8), path=_PATHS)
def test_arbitrary_request_shapes_give_a_verdict(body: dict[str, Any], path: str) -> None:
    raw = json.dumps(body).encode()
    _check_verdict(evaluate_body(raw, path, {}, P))
    _check_verdict(evaluate_body(raw, path, {}, _OPEN))
