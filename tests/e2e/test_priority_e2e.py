"""Priorities reach a real vLLM (issue 25): keys' priorities decide its order of service.

vLLM 0.32 under ``--scheduling-policy priority`` with ``--max-num-seqs 1`` runs one request at a
time and takes the next from its waiting queue by ``(priority, arrival)``. Through the guard,
keys at priority 10 (``batch``) and -10 (``ui``) send requests that name no priority: while a
long request holds the one running place, a ``batch`` request and then a ``ui`` one queue in
vLLM, and the ``ui`` one, later, is served first: the priority the guard injected is the one
vLLM scheduled by. The control: the ``ui`` client asking for 20 (worse than its key's, so
forwarded as asked) is served after the ``batch`` request. Decisions (an order, refusals), not
speed. Under FCFS vLLM 0.32 would accept the same bodies and ignore their priorities.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from guard.app import create_app
from guard.policy import policy_from_yaml
from tests._guard_harness import serve
from tests.e2e.conftest import RunningUpstream, start_upstream

UI, BATCH = "sk-ui-tenant", "sk-batch-tenant"
# Long enough to hold vLLM's one place while two requests queue (the model's window is 4096);
# a machine fast enough to finish it first makes a try inconclusive, and it is tried again.
HOG_TOKENS = 4000
TRIES = 3
# Each queued request's own length: the second starts only when the first has ended (one place),
# so their answers arrive about this many decode steps apart, in the order vLLM served them.
QUEUED_TOKENS = 200


@pytest.fixture(scope="module")
def priority_vllm() -> Iterator[RunningUpstream]:
    yield from start_upstream("vllm", "--scheduling-policy", "priority", "--max-num-seqs", "1")


def _policy_yaml(upstream: RunningUpstream) -> str:
    # capacity 8: the guard lets everything through at once, so the order is vLLM's.
    return f"""
upstream: {{priority_scheduling: true, capacity: 8}}
limits: {{tokens: {{tokenizer: {upstream.tokenizer_json}}}}}
rate: {{requests_per_minute: null, tokens_per_minute: null}}
keys:
  - {{key: {UI}, tenant: ui, rate: {{priority: -10}}}}
  - {{key: {BATCH}, tenant: batch, rate: {{priority: 10}}}}
"""


async def _gauge(client: httpx.AsyncClient, base_url: str, name: str) -> float:
    text = (await client.get(base_url + "/metrics")).text
    return sum(float(v) for v in re.findall(rf"^vllm:{name}\{{[^}}]*\}} ([0-9.]+)$", text, re.M))


async def _until(client: httpx.AsyncClient, upstream: RunningUpstream, name: str, n: int,
                 hog: asyncio.Task[None]) -> None:  # fmt: skip
    for _ in range(1200):
        if await _gauge(client, upstream.base_url, name) >= n:
            return
        if hog.done():
            raise _Inconclusive("the long request ended before the others queued")
        await asyncio.sleep(0.05)  # polling vLLM's gauges, not timing a test
    raise AssertionError(f"vLLM's {name} never reached {n}")


class _Inconclusive(Exception):
    pass


async def _served_order(
    guard: str, upstream: RunningUpstream, ui_fields: dict[str, Any]
) -> list[str]:
    for _ in range(TRIES - 1):
        with contextlib.suppress(_Inconclusive):
            return await _one_order(guard, upstream, ui_fields)
    return await _one_order(guard, upstream, ui_fields)


async def _one_order(guard: str, upstream: RunningUpstream, ui_fields: dict[str, Any]) -> list[str]:
    """Hold vLLM's one place with a long ``batch`` request, queue a ``batch`` request then a
    ``ui`` one (with ``ui_fields``), and return the order the two were answered in."""
    order: list[str] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def post(name: str, key: str, tokens: int, fields: dict[str, Any]) -> None:
            body = {"model": upstream.model, "prompt": "Hi", "max_tokens": tokens,
                    "ignore_eos": True, **fields}  # fmt: skip
            resp = await client.post(
                guard + "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
            )
            assert resp.status_code == 200, resp.text
            order.append(name)

        hog = asyncio.create_task(post("hog", BATCH, HOG_TOKENS, {}))
        tasks = [hog]
        try:
            await _until(client, upstream, "num_requests_running", 1, hog)
            tasks.append(asyncio.create_task(post("batch", BATCH, QUEUED_TOKENS, {})))
            await _until(client, upstream, "num_requests_waiting", 1, hog)
            tasks.append(asyncio.create_task(post("ui", UI, QUEUED_TOKENS, ui_fields)))
            await _until(client, upstream, "num_requests_waiting", 2, hog)
        except _Inconclusive:
            await asyncio.gather(*tasks)  # vLLM idle again before the next try
            raise
        await asyncio.gather(*tasks)
    # The hog held the one place while both queued (vLLM's gauges above); its long answer may
    # reach the client after the short ones that ran after it, so only theirs is compared.
    return [name for name in order if name != "hog"]


@pytest.mark.timeout(900)
async def test_a_keys_priority_decides_vllms_order(
    priority_vllm: RunningUpstream, tmp_path: Path
) -> None:
    policy = policy_from_yaml(_policy_yaml(priority_vllm))
    async with serve(create_app(policy, upstream_url=priority_vllm.base_url)) as guard:
        # The ui key's requests carry -10 (injected): served before the earlier batch one (10).
        assert await _served_order(guard, priority_vllm, {}) == ["ui", "batch"]
        # Asking for 20 (worse than its key's, so forwarded as asked): served after it.
        assert await _served_order(guard, priority_vllm, {"priority": 20}) == ["batch", "ui"]
        # A better priority than the key's is refused before it reaches vLLM.
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": priority_vllm.model, "prompt": "Hi", "max_tokens": 2}
            for key, asked in ((BATCH, 0), (UI, -11)):
                resp = await client.post(
                    guard + "/v1/completions",
                    json={**body, "priority": asked},
                    headers={"authorization": f"Bearer {key}"},
                )
                assert resp.status_code == 400
                assert resp.json()["error"]["code"] == "priority_not_allowed"
