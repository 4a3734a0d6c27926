"""vLLM's per-request fields that change its cost (issue 14 item 5): denied, bounded or allowed,
each decided from vLLM 0.32's request models; the upstream-control headers are stripped.

The field decisions through the schema check (what the pipeline runs), the headers through a
real guard in front of a fake upstream that records what it received.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from guard.app import create_app
from guard.checks import check_fanout, check_schema
from guard.checks._cost_fields import MAX_REPETITION_PATTERN
from guard.pipeline import evaluate_body
from guard.policy import default_policy, policy_from_yaml
from guard.request import RequestView
from tests._guard_harness import fake_upstream, serve

P = default_policy()
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MSG = [{"role": "user", "content": "hi"}]
RESPONSES_POLICY = policy_from_yaml("routes: [/v1/responses]")


def body_for(path: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        CHAT: {"model": "m", "messages": MSG},
        COMPLETIONS: {"model": "m", "prompt": "hi"},
        EMBEDDINGS: {"model": "m", "input": "hi"},
        RESPONSES: {"model": "m", "input": "hi"},
    }[path]
    return {**base, **fields}


def verdict(path: str, **fields: Any) -> tuple[str | None, str | None]:
    view = RequestView.build(body_for(path, **fields), path=path)
    result = check_schema(view, RESPONSES_POLICY)
    err = result.rejection
    return (None, None) if err is None else (err.code, err.param)


# --------------------------------------------------------------------------------- denied


DENIED = [
    ("media_io_kwargs", {"video": {"num_frames": 10000}}),
    ("mm_processor_kwargs", {"max_pixels": 10**9}),
    ("kv_transfer_params", {"prompt_token_ids": [1] * 100_000, "do_remote_prefill": True}),
    ("ec_transfer_params", {"x": 1}),
    ("vllm_xargs", {"session_id": "s"}),
    ("request_id", "chatcmpl-other-tenant"),
    ("session_id", "s-1"),
    ("prompt_embeds", "AAAA"),
    ("return_prompt_text", True),
    ("logits_processors", ["my.module:Proc"]),
]


@pytest.mark.parametrize(("field", "value"), DENIED, ids=[d[0] for d in DENIED])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, EMBEDDINGS])
def test_denied_fields_are_refused_whatever_their_value(path: str, field: str, value: Any) -> None:
    assert verdict(path, **{field: value}) == ("field_not_allowed", field)


@pytest.mark.parametrize("field", ["media_io_kwargs", "kv_transfer_params", "vllm_xargs"])
def test_denied_in_every_unknown_fields_mode(field: str) -> None:
    for mode in ("allow", "reject"):
        policy = policy_from_yaml(f"limits: {{schema: {{unknown_fields: {mode}}}}}")
        view = RequestView.build(body_for(CHAT, **{field: {}}), path=CHAT)
        err = check_schema(view, policy).rejection
        assert err is not None and err.code == "field_not_allowed", mode


def test_a_trusted_deployment_can_allow_one_back() -> None:
    policy = policy_from_yaml("limits: {schema: {denied_fields: [logits_processors]}}")
    view = RequestView.build(body_for(CHAT, kv_transfer_params={"x": 1}), path=CHAT)
    assert check_schema(view, policy).rejection is None


def test_responses_history_fields_are_denied() -> None:
    assert verdict(RESPONSES, previous_response_id="resp_1") == (
        "field_not_allowed",
        "previous_response_id",
    )
    assert verdict(RESPONSES, previous_input_messages=[]) == (
        "field_not_allowed",
        "previous_input_messages",
    )


# -------------------------------------------------------------------------------- bounded


@pytest.mark.parametrize(
    ("path", "field", "costly", "free"),
    [
        (CHAT, "priority", -10, 0),
        (COMPLETIONS, "priority", 5, 0),
        (EMBEDDINGS, "priority", 1, 0),
        (CHAT, "use_beam_search", True, False),
        (COMPLETIONS, "use_beam_search", True, False),
        (CHAT, "watermarking", False, True),
        (EMBEDDINGS, "padding", "max_length", "do_not_pad"),
        (RESPONSES, "background", True, False),
        (RESPONSES, "store", True, False),
    ],
)
def test_bounded_fields_refuse_only_the_costly_value(
    path: str, field: str, costly: Any, free: Any
) -> None:
    assert verdict(path, **{field: costly}) == ("field_not_allowed", field)
    assert verdict(path, **{field: free}) == (None, None)


def test_repetition_detection_window_is_bounded() -> None:
    ok = {"max_pattern_size": MAX_REPETITION_PATTERN, "min_count": 3}
    assert verdict(CHAT, repetition_detection=ok) == (None, None)
    big = {"max_pattern_size": 10**6, "min_count": 2}
    assert verdict(CHAT, repetition_detection=big) == (
        "field_not_allowed",
        "repetition_detection.max_pattern_size",
    )


def test_responses_tools_are_functions_or_custom_only() -> None:
    function = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    custom = {"type": "custom", "name": "c"}
    assert verdict(RESPONSES, tools=[function, custom]) == (None, None)
    for kind in ("web_search_preview", "code_interpreter", "mcp", "file_search"):
        assert verdict(RESPONSES, tools=[function, {"type": kind}]) == (
            "field_not_allowed",
            "tools[1].type",
        )


def test_responses_store_is_turned_off_when_absent() -> None:
    result = evaluate_body(
        b'{"model":"m","input":"hi","max_output_tokens":4}', RESPONSES, {}, RESPONSES_POLICY
    )
    assert result.allowed
    forwarded = result.forward_body(b'{"model":"m","input":"hi","max_output_tokens":4}')
    assert b'"store":false' in forwarded.replace(b" ", b"")


# ------------------------------------------------------------------------- fan-out bounds


def test_stop_count_matches_vllm() -> None:
    assert P.limits.fanout.max_stop_sequences == 4
    assert verdict(CHAT, stop=["a", "b", "c", "d"]) == (None, None)
    view = RequestView.build(body_for(CHAT, stop=["a", "b", "c", "d", "e"]), path=CHAT)
    err = check_fanout(view, P).rejection
    assert err is not None and (err.code, err.param) == ("stop_exceeded", "stop")


@pytest.mark.parametrize("field", ["stop_token_ids", "allowed_token_ids", "logprob_token_ids"])
def test_token_id_lists_are_bounded(field: str) -> None:
    cap = P.limits.fanout.max_token_ids
    ok = RequestView.build(body_for(COMPLETIONS, **{field: list(range(cap))}), path=COMPLETIONS)
    assert check_fanout(ok, P).rejection is None
    over = RequestView.build(
        body_for(COMPLETIONS, **{field: list(range(cap + 1))}), path=COMPLETIONS
    )
    err = check_fanout(over, P).rejection
    assert err is not None and (err.code, err.param) == ("token_ids_exceeded", field)


def test_bad_words_are_bounded() -> None:
    cap = P.limits.fanout.max_bad_words
    view = RequestView.build(body_for(CHAT, bad_words=["w"] * (cap + 1)), path=CHAT)
    err = check_fanout(view, P).rejection
    assert err is not None and err.code == "bad_words_exceeded"


# ------------------------------------------------------------------------ allowed, as is


def test_allowed_cost_neutral_fields_pass() -> None:
    for path, fields in [
        (CHAT, {"cache_salt": "tenant-a", "truncate_prompt_tokens": 100, "seed": 7}),
        (CHAT, {"priority": 0, "use_beam_search": False, "stream_options": {}}),
        (COMPLETIONS, {"add_special_tokens": True, "return_token_ids": True}),
        (EMBEDDINGS, {"dimensions": 8, "encoding_format": "float"}),
    ]:
        assert verdict(path, **fields) == (None, None), fields


# ------------------------------------------------------------- upstream-control headers


async def test_upstream_control_headers_are_stripped_over_http() -> None:
    async with fake_upstream() as fake:
        app = create_app(P, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
            headers = {
                "X-Vllm-Priority": "-100",
                "x-session-id": "s1",
                "X-data-parallel-rank": "3",
                "endpoint-load-metrics-format": "json",
                "x-kept": "yes",
            }
            body = {"model": "m", "messages": MSG, "max_tokens": 2}
            resp = await client.post(CHAT, json=body, headers=headers)
            assert resp.status_code == 200, resp.text
    got = {k.lower(): v for k, v in fake.received[-1].headers.items()}
    assert got["x-kept"] == "yes"
    for name in headers:
        if name != "x-kept":
            assert name.lower() not in got, name


async def test_stripped_headers_are_policy() -> None:
    policy = policy_from_yaml("upstream: {strip_headers: [X-Tenant-Override]}")
    async with fake_upstream() as fake:
        app = create_app(policy, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
            resp = await client.post(
                CHAT,
                json={"model": "m", "messages": MSG, "max_tokens": 2},
                headers={"x-tenant-override": "b", "x-session-id": "s"},
            )
            assert resp.status_code == 200
    got = {k.lower() for k in fake.received[-1].headers}
    assert "x-tenant-override" not in got and "x-session-id" in got


def test_a_strip_list_must_hold_header_names() -> None:
    with pytest.raises(ValueError, match="header name"):
        policy_from_yaml("upstream: {strip_headers: ['bad name']}")
