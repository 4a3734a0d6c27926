"""Priorities where the upstream has them (issue 25): each key's `rate.priority`, bounded and
injected under `upstream.priority_scheduling`, refused other than 0 without it.

The policy's validation, the decisions through the schema check (what the pipeline runs, with
the caller's key resolved as the gateway resolves it), the bytes forwarded, and what a fake
upstream receives through a real guard and through the ext_proc processor.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from guard.app import create_app
from guard.checks._priority import PRIORITY_MAX, PRIORITY_MIN
from guard.gateway import build_gateway, forward_body
from guard.http import PRIORITY_HEADER, dropped_headers
from guard.pipeline import Verdict, evaluate_body
from guard.policy import Policy, PolicyError, policy_from_yaml
from guard.request import KEPT_HEADERS
from tests._envoy import extproc_in_process
from tests._guard_harness import fake_upstream, serve
from tests._support import free_port
from tests.guard.extproc.test_processor import _exchange, _headers, _idle

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
INTERACTIVE, BATCH, PLAIN = "sk-interactive", "sk-batch-key", "sk-plain-key"
KEYS = f"""
keys:
  - {{key: {INTERACTIVE}, tenant: ui, rate: {{priority: -10}}}}
  - {{key: {BATCH}, tenant: batch, rate: {{priority: 10}}}}
  - {{key: {PLAIN}, tenant: plain}}
"""
ON = policy_from_yaml("upstream: {priority_scheduling: true}" + KEYS)
OFF = policy_from_yaml(KEYS)
BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": MSG},
    "/v1/completions": {"model": "m", "prompt": "hi"},
    "/v1/responses": {"model": "m", "input": "hi", "store": False},
    "/v1/embeddings": {"model": "m", "input": "hi"},
    "/score": {"model": "m", "text_1": "a", "text_2": "b"},
    "/tokenize": {"model": "m", "prompt": "hi"},
}
ROUTES = "routes: [/v1/responses, /score, /tokenize]\n"


def judge(
    policy: Policy,
    key: str | None,
    path: str = CHAT,
    header: str | None = None,
    **fields: Any,
) -> tuple[Verdict, bytes, bytes]:
    """The verdict on one body, the body as sent and the body the guard would forward."""
    raw = json.dumps({**BODIES[path], **fields}).encode()
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    if header is not None:
        headers[PRIORITY_HEADER] = header
    verdict = evaluate_body(raw, path, headers, policy)
    return verdict, raw, forward_body(verdict, raw) if verdict.allowed else b""


def forwarded_priority(policy: Policy, key: str | None, **kw: Any) -> Any:
    verdict, _, out = judge(policy, key, **kw)
    assert verdict.allowed, verdict.rejection
    return json.loads(out).get("priority", "absent")


# ---------------------------------------------------------------------------------- policy


def test_each_key_has_the_global_priority_unless_its_entry_overrides_it() -> None:
    keys = {k.tenant: k for k in ON.keys}
    assert ON.priority_for(keys["ui"]) == -10
    assert ON.priority_for(keys["batch"]) == 10
    assert ON.priority_for(keys["plain"]) == 0
    assert ON.priority_for(None) == 0  # the anonymous tenant: the policy's default
    moved = policy_from_yaml("upstream: {priority_scheduling: true}\nrate: {priority: 3}" + KEYS)
    assert moved.priority_for(None) == 3
    assert moved.priority_for({k.tenant: k for k in moved.keys}["plain"]) == 3
    assert moved.priority_for({k.tenant: k for k in moved.keys}["ui"]) == -10


def test_without_priority_scheduling_no_caller_has_a_priority() -> None:
    assert all(OFF.priority_for(k) is None for k in (*OFF.keys, None))
    assert OFF.upstream.priority_scheduling is False  # the default


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("upstream: {priority_scheduling: true, kind: llama_cpp}", "llama.cpp has no priority"),
        ("rate: {priority: 1.5}", "rate.priority: must be an integer"),
        ("rate: {priority: true}", "rate.priority: must be an integer"),
        ("rate: {priority: '3'}", "rate.priority: must be an integer"),
        (f"rate: {{priority: {PRIORITY_MAX + 1}}}", f"must be <= {PRIORITY_MAX}"),
        (f"rate: {{priority: {PRIORITY_MIN - 1}}}", f"must be >= {PRIORITY_MIN}"),
        ("keys: [{key: sk-aaaaaaaa, tenant: a, rate: {priority: x}}]", "keys[0].rate.priority"),
        ("upstream: {priority_scheduling: maybe}", "upstream.priority_scheduling"),
        (
            "upstream: {priority_scheduling: true}\nchecks: [fanout, tokens]",
            "upstream.priority_scheduling needs the schema check",
        ),
    ],
)
def test_bad_priority_settings_are_named(yaml: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace(".", r"\.")):
        policy_from_yaml(yaml)


def test_a_null_override_inherits() -> None:
    policy = policy_from_yaml(
        "upstream: {priority_scheduling: true}\nrate: {priority: 4}\n"
        "keys: [{key: sk-aaaaaaaa, tenant: a, rate: {priority: null}}]"
    )
    assert policy.priority_for(policy.keys[0]) == 4


# ------------------------------------------------------------------ priority scheduling off


@pytest.mark.parametrize("value", [1, -1, -1000])
def test_off_a_priority_other_than_0_is_refused_and_says_why(value: Any) -> None:
    verdict, _, _ = judge(OFF, INTERACTIVE, priority=value)
    err = verdict.rejection
    assert err is not None and (err.code, err.status, err.param) == (
        "field_not_allowed",
        400,
        "priority",
    )
    assert "upstream.priority_scheduling is off" in err.message


@pytest.mark.parametrize("path", list(BODIES))
def test_off_an_ordinary_request_is_forwarded_as_sent(path: str) -> None:
    policy = policy_from_yaml(ROUTES + KEYS)
    for fields in ({}, {"priority": 0}):
        verdict, raw, out = judge(policy, INTERACTIVE, path, **fields)
        assert verdict.allowed and out == raw and not verdict.mutations, (path, fields)


def test_off_the_header_is_left_to_the_http_layer() -> None:
    # Not read, not refused: stripped by `upstream.strip_headers` as before (see the app test).
    verdict, raw, out = judge(OFF, INTERACTIVE, header="-100")
    assert verdict.allowed and out == raw


# ------------------------------------------------------------------- priority scheduling on


def test_on_the_keys_priority_is_spliced_into_a_body_without_one() -> None:
    verdict, raw, out = judge(ON, BATCH)
    assert [m.to_dict() for m in verdict.mutations] == [
        {"path": ["priority"], "value": 10, "reason": "key_priority"}
    ]
    assert out == b'{"priority":10,' + raw[1:]  # spliced, the client's bytes kept
    assert forwarded_priority(ON, INTERACTIVE) == -10


def test_on_a_priority_of_0_is_not_injected() -> None:
    # vLLM's default: an ordinary request of a key at 0 (and the anonymous tenant's) unaltered.
    for key in (PLAIN, None):
        policy = ON if key else policy_from_yaml("upstream: {priority_scheduling: true}")
        verdict, raw, out = judge(policy, key)
        assert verdict.allowed and out == raw and not verdict.mutations


def test_on_the_anonymous_tenant_gets_the_policys_priority() -> None:
    policy = policy_from_yaml("upstream: {priority_scheduling: true}\nrate: {priority: 7}")
    assert forwarded_priority(policy, None) == 7
    verdict, _, _ = judge(policy, None, priority=6)
    assert verdict.code == "priority_not_allowed"


@pytest.mark.parametrize(
    ("key", "asked"), [(BATCH, 9), (BATCH, 0), (INTERACTIVE, -11), (PLAIN, -1)]
)
def test_on_a_better_priority_than_the_keys_is_refused(key: str, asked: int) -> None:
    verdict, _, _ = judge(ON, key, priority=asked)
    err = verdict.rejection
    assert err is not None
    assert (err.code, err.status, err.param) == ("priority_not_allowed", 400, "priority")
    assert f"priority {asked} is better than this key may ask for" in err.message


@pytest.mark.parametrize(("key", "asked"), [(BATCH, 10), (BATCH, 50), (INTERACTIVE, -10),
                                            (INTERACTIVE, 0), (PLAIN, PRIORITY_MAX)])  # fmt: skip
def test_on_the_keys_priority_or_a_worse_one_is_forwarded_unchanged(key: str, asked: int) -> None:
    verdict, raw, out = judge(ON, key, priority=asked)
    assert verdict.allowed and out == raw and not verdict.mutations


def test_on_a_priority_past_vllms_integer_is_refused() -> None:
    verdict, _, _ = judge(ON, PLAIN, priority=PRIORITY_MAX + 1)
    assert verdict.code == "invalid_value"


@pytest.mark.parametrize(
    ("path", "injected"),
    [(CHAT, True), ("/v1/completions", True), ("/v1/responses", True),
     ("/v1/embeddings", True), ("/score", True), ("/tokenize", False)],
)  # fmt: skip
def test_on_the_priority_is_injected_where_the_engine_schedules_by_it(
    path: str, injected: bool
) -> None:
    policy = policy_from_yaml("upstream: {priority_scheduling: true}\n" + ROUTES + KEYS)
    got = forwarded_priority(policy, BATCH, path=path)
    assert got == (10 if injected else "absent")
    verdict, _, _ = judge(policy, BATCH, path, priority=3)
    assert verdict.code == "priority_not_allowed", path  # bounded on every route


# --------------------------------------------------------------------- X-Vllm-Priority, on


def test_on_the_header_is_judged_as_the_priority_and_moved_into_the_body() -> None:
    assert forwarded_priority(ON, BATCH, header="12") == 12
    assert forwarded_priority(ON, BATCH, header=" 10 ") == 10
    # vLLM lets the header override the body: so does the guard, in the body it forwards.
    assert forwarded_priority(ON, BATCH, header="20", priority=15) == 20
    verdict, raw, out = judge(ON, BATCH, header="15", priority=15)
    assert verdict.allowed and out == raw  # the body says it already


@pytest.mark.parametrize("header", ["9", "-10", "+0"])
def test_on_a_better_header_than_the_keys_is_refused(header: str) -> None:
    verdict, _, _ = judge(ON, BATCH, header=header, priority=50)
    err = verdict.rejection
    assert err is not None
    assert (err.code, err.param) == ("priority_not_allowed", "X-Vllm-Priority")


@pytest.mark.parametrize("header", ["high", "1.5", "", "1_0", str(PRIORITY_MAX + 1), "٣"])
def test_on_a_header_that_is_not_an_integer_is_refused(header: str) -> None:
    verdict, _, _ = judge(ON, BATCH, header=header)
    err = verdict.rejection
    assert err is not None and (err.code, err.param) == ("invalid_value", "X-Vllm-Priority")


def test_on_the_header_is_ignored_where_vllm_ignores_it() -> None:
    policy = policy_from_yaml("upstream: {priority_scheduling: true}\n" + ROUTES + KEYS)
    assert forwarded_priority(policy, BATCH, path="/v1/embeddings", header="-50") == 10


def test_on_the_header_is_never_forwarded_whatever_the_strip_list() -> None:
    assert PRIORITY_HEADER in KEPT_HEADERS  # the view keeps it for the schema check
    for upstream in (
        "{priority_scheduling: true}",
        "{priority_scheduling: true, strip_headers: []}",
    ):
        policy = policy_from_yaml(f"upstream: {upstream}")
        assert PRIORITY_HEADER.encode() in dropped_headers(policy.upstream)
    kept = policy_from_yaml("upstream: {strip_headers: []}")
    assert PRIORITY_HEADER.encode() not in dropped_headers(kept.upstream)  # off: as configured


# ------------------------------------------------------------------------- through the guard


async def _through_guard(
    policy: Policy, requests: list[tuple[str, dict[str, Any], dict[str, str]]]
) -> tuple[list[httpx.Response], list[dict[str, Any]], list[dict[str, str]]]:
    async with fake_upstream() as fake:
        app = create_app(policy, upstream_url=fake.url)
        answers = []
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
            for key, fields, headers in requests:
                body = {"model": "m", "messages": MSG, "max_tokens": 2, **fields}
                auth = {"authorization": f"Bearer {key}", **headers}
                answers.append(await client.post(CHAT, json=body, headers=auth))
    bodies = [json.loads(r.body) for r in fake.received]
    headers_seen = [{k.lower(): v for k, v in r.headers.items()} for r in fake.received]
    return answers, bodies, headers_seen


async def test_the_upstream_sees_each_keys_priority() -> None:
    answers, bodies, headers = await _through_guard(
        ON,
        [
            (INTERACTIVE, {}, {}),
            (BATCH, {}, {}),
            (PLAIN, {}, {}),
            (BATCH, {"priority": 30}, {}),
            (BATCH, {}, {"X-Vllm-Priority": "40"}),
            (BATCH, {"priority": 0}, {}),  # refused: never reaches the upstream
            (INTERACTIVE, {}, {"X-Vllm-Priority": "-11"}),  # refused too
        ],
    )
    assert [a.status_code for a in answers] == [200] * 5 + [400, 400]
    assert [b.get("priority") for b in bodies] == [-10, 10, None, 30, 40]
    assert all(PRIORITY_HEADER not in h for h in headers)
    for refused, param in ((answers[5], "priority"), (answers[6], "X-Vllm-Priority")):
        error = refused.json()["error"]
        assert (error["code"], error["type"], error["param"]) == (
            "priority_not_allowed",
            "invalid_request_error",
            param,
        )


async def test_off_the_upstream_sees_the_request_as_sent() -> None:
    answers, bodies, headers = await _through_guard(
        OFF,
        [
            (INTERACTIVE, {}, {"X-Vllm-Priority": "-100"}),
            (BATCH, {"priority": 0}, {}),
            (BATCH, {"priority": 5}, {}),
        ],
    )
    assert [a.status_code for a in answers] == [200, 200, 400]
    assert answers[2].json()["error"]["code"] == "field_not_allowed"
    assert bodies == [
        {"model": "m", "messages": MSG, "max_tokens": 2},
        {"model": "m", "messages": MSG, "max_tokens": 2, "priority": 0},
    ]
    assert all(PRIORITY_HEADER not in h for h in headers)  # stripped as before


async def test_the_dry_run_shows_the_injected_priority() -> None:
    async with fake_upstream() as fake:
        app = create_app(ON, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
            resp = await client.post(
                "/guard/v1/check",
                params={"path": CHAT},
                json={"model": "m", "messages": MSG},
                headers={"authorization": f"Bearer {BATCH}"},
            )
    assert resp.status_code == 200, resp.text
    assert {"path": ["priority"], "value": 10, "reason": "key_priority"} in resp.json()["mutations"]


# --------------------------------------------------------------------- under Envoy's ext_proc


async def test_ext_proc_answers_with_the_keys_priority_in_the_body_and_the_header_removed() -> None:
    gateway = build_gateway(ON, upstream=None)
    body = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'
    request = [(":method", "POST"), (":path", CHAT), (":authority", "x"),
               ("content-type", "application/json"), ("content-length", str(len(body))),
               ("authorization", f"Bearer {BATCH}"), ("x-vllm-priority", "11")]  # fmt: skip
    async with extproc_in_process(ON, gateway=gateway, admin=free_port()) as port:
        answers, code = await _exchange(
            port,
            [
                pb.ProcessingRequest(request_headers=_headers(request)),
                pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
            ],
        )
        await _idle(gateway)
    assert code == grpc.StatusCode.OK
    common = answers[1].request_body.response
    assert common.body_mutation.body == b'{"priority":11,' + body[1:]
    assert "x-vllm-priority" in common.header_mutation.remove_headers
