"""Priorities reach a real vLLM (issue 25): keys' priorities decide its order of service.

vLLM 0.32 under ``--scheduling-policy priority`` with ``--max-num-seqs 1`` runs one request at a
time and takes the next from its waiting queue by ``(priority, arrival)``. Through the guard,
keys at priority 10 (``batch``) and -10 (``ui``) send requests that name no priority: while a
long request holds the one running place, a ``batch`` request and then a ``ui`` one queue in
vLLM, and the ``ui`` one, later, is served first: the priority the guard injected is the one
vLLM scheduled by. The control: the ``ui`` client asking for 20 (worse than its key's, so
forwarded as asked) is served after the ``batch`` request. Decisions (an order, refusals), not
speed. Under FCFS vLLM 0.32 would accept the same bodies and ignore their priorities.

The long request is a stream far longer than the test needs (the window is stretched for it),
cancelled once the two are answered: on a busy machine processes stall for seconds (measured
here: a 10 s request let neither queued request reach vLLM), so its length is the margin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
# The window vLLM is started with for this test (the tiny model's is 4096; its RoPE does not
# care), and the long request's length: minutes of decoding, cut short once the order is known.
WINDOW = 65536
HOG_TOKENS = 60000
TRIES = 3
# Each queued request's own length: the second starts only when the first has ended (one place),
# so their answers arrive about this many decode steps apart, in the order vLLM served them.
QUEUED_TOKENS = 200


@pytest.fixture(scope="module")
def priority_vllm() -> Iterator[RunningUpstream]:
    # vLLM refuses a window past the model's max_position_embeddings unless told it may.
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    try:
        yield from start_upstream(
            "vllm", "--scheduling-policy", "priority", "--max-num-seqs", "1",
            "--max-model-len", str(WINDOW),
        )  # fmt: skip
    finally:
        del os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"]


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


async def _gauge(gauges: httpx.AsyncClient, base_url: str, name: str) -> float:
    text = (await gauges.get(base_url + "/metrics")).text
    return sum(float(v) for v in re.findall(rf"^vllm:{name}\{{[^}}]*\}} ([0-9.]+)$", text, re.M))


async def _until(gauges: httpx.AsyncClient, upstream: RunningUpstream, name: str, n: int,
                 hog: asyncio.Task[None] | None) -> None:  # fmt: skip
    """Poll until vLLM's gauge ``name`` is at least ``n`` (none running when ``n`` is 0)."""
    for _ in range(1200):
        value = await _gauge(gauges, upstream.base_url, name)
        if value >= n if n else value == 0:
            return
        if hog is not None and hog.done():
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
    # A new connection for every poll: a poll delayed past vLLM's 5 s keep-alive would
    # otherwise be sent on a connection vLLM is closing.
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    async with (
        httpx.AsyncClient(timeout=600) as client,
        httpx.AsyncClient(timeout=60, limits=no_reuse) as gauges,
    ):

        async def post(name: str, key: str, tokens: int, fields: dict[str, Any]) -> None:
            body = {"model": upstream.model, "prompt": "Hi", "max_tokens": tokens,
                    "ignore_eos": True, **fields}  # fmt: skip
            resp = await client.post(
                guard + "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
            )
            assert resp.status_code == 200, resp.text
            order.append(name)

        # The previous try's long request, cancelled, may still be leaving vLLM.
        await _until(gauges, upstream, "num_requests_running", 0, None)
        hog = asyncio.create_task(post("hog", BATCH, HOG_TOKENS, {}))
        queued: list[asyncio.Task[None]] = []
        try:
            await _until(gauges, upstream, "num_requests_running", 1, hog)
            queued.append(asyncio.create_task(post("batch", BATCH, QUEUED_TOKENS, {})))
            await _until(gauges, upstream, "num_requests_waiting", 1, hog)
            queued.append(asyncio.create_task(post("ui", UI, QUEUED_TOKENS, ui_fields)))
            await _until(gauges, upstream, "num_requests_waiting", 2, hog)
            # The hog holds the one place until cancelled: the two are served only after it
            # ends, so it is cancelled once both wait (the guard then ends it in vLLM).
            hog.cancel()
            await asyncio.gather(*queued)
        finally:
            hog.cancel()
            await asyncio.gather(hog, *queued, return_exceptions=True)
    return order


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
