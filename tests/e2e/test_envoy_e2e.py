"""Envoy (the pinned wheel) + ``schedguard extproc`` in front of real vLLM and llama-cpp-python,
beside the guard's own proxy in front of the same server: the same answers.

Benign requests with the openai client, whole and streamed, get the model's answer through
Envoy with their tokens settled; every attack of the corpus (pipeline layer) gets the same
status and code through Envoy as from the proxy, and the server is still healthy after.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from guard.app import create_app
from guard.gateway import build_gateway
from guard.policy import load_policy
from payloads.loader import load_corpus
from tests._corpus_client import send
from tests._envoy import extproc_in_process, start_envoy
from tests._guard_harness import serve
from tests.e2e.conftest import RunningUpstream

KEY = "sk-envoy-e2e-0001"
ATTACKS = [p for p in load_corpus(kind="attack") if p.layer == "pipeline" and "flood" not in p.tags]


@pytest.mark.parametrize("upstream_name", ["vllm_upstream", "llamacpp_upstream"])
async def test_envoy_and_extproc_in_front_of_a_real_server(
    upstream_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    upstream: RunningUpstream = request.getfixturevalue(upstream_name)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        f"limits:\n  tokens:\n    tokenizer: {upstream.tokenizer_json}\n"
        "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
        f"keys:\n  - key: {KEY}\n    tenant: e2e\n",
        encoding="utf-8",
    )
    policy = load_policy(str(policy_file), {})
    gateway = build_gateway(policy, upstream=None)
    async with (
        extproc_in_process(policy, upstream=upstream.base_url, gateway=gateway) as port,
        start_envoy(processor=port, upstream=upstream.port) as envoy,
        serve(create_app(policy, upstream_url=upstream.base_url)) as proxy_url,
    ):
        client = openai.AsyncOpenAI(base_url=envoy.url + "/v1", api_key=KEY, max_retries=0)
        messages = [{"role": "user", "content": "Say hello."}]
        whole = await client.chat.completions.create(
            model=upstream.model,
            messages=messages,
            max_tokens=8,  # type: ignore[arg-type]
        )
        assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
        stream = await client.chat.completions.create(
            model=upstream.model, messages=messages, max_tokens=8, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
        # (llama-cpp-python sends no usage chunk: the guard counts the deltas)
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        with pytest.raises(openai.AuthenticationError):
            bad = openai.AsyncOpenAI(base_url=envoy.url + "/v1", api_key="sk-wrong", max_retries=0)
            await bad.chat.completions.create(model=upstream.model, messages=messages)  # type: ignore[arg-type]

        def both() -> list[tuple[str, object, object]]:
            out = []
            with (
                httpx.Client(base_url=proxy_url, timeout=60) as proxied,
                httpx.Client(base_url=envoy.url, timeout=60) as through_envoy,
            ):
                for payload in ATTACKS:
                    a, b = send(proxied, payload, KEY), send(through_envoy, payload, KEY)
                    out.append((payload.id, (a.status, a.code), (b.status, b.code)))
            return out

        answers = await asyncio.to_thread(both)
        for _ in range(100):  # the streams' settlement, at their end
            if gateway.metrics.in_flight == 0:
                break
            await asyncio.sleep(0.05)
        health = httpx.get(upstream.base_url + "/v1/models", timeout=10)
    different = [(pid, a, b) for pid, a, b in answers if a != b]
    assert not different, different
    assert len(answers) > 100
    assert gateway.metrics.tokens[("e2e", "out")] > 0
    assert gateway.concurrency.in_flight == 0
    assert health.status_code == 200
