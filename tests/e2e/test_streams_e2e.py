"""Whole streams through the guard to llama-cpp-python, with the openai client (issue 15).

The client reads every stream to its ``[DONE]`` and closes, as the openai client does; the
guard (``schedguard serve``, a capped child process) must log each as a 200 with its token
counts, never as a 499 ``client_disconnected`` (before the fix, 12 of 200 with four clients at
once). llama-cpp-python serves one request at a time and ends a running stream when a new one
arrives, with ``[DONE]`` and no ``finish_reason``: with four clients most streams are cut so,
and the guard counts exactly those as truncated (``no_finish_reason``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest

from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import RunningUpstream

STREAMS = 200


def _policy(tmp: Path, tokenizer: Path) -> Path:
    policy = tmp / "policy.yaml"
    policy.write_text(
        f"limits:\n  tokens:\n    tokenizer: {tokenizer}\n"
        "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
    )
    return policy


async def _streams(base_url: str, model: str, n: int, clients: int) -> Counter[str | None]:
    """``n`` streams from ``clients`` at once, each read to the end; their finish reasons."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="sk-x", max_retries=0)
    reasons: Counter[str | None] = Counter()
    gate = asyncio.Semaphore(clients)

    async def one(i: int) -> None:
        async with gate:
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"Count to {i}"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            finish = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            reasons[finish] += 1

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()
    return reasons


def _access_lines(guard: RunningServer, n: int) -> list[dict[str, Any]]:
    """The guard's access lines, once ``n`` are written (they are flushed every 0.1 s)."""
    deadline = time.monotonic() + 30
    while True:
        lines = [
            json.loads(line)
            for line in guard.log_tail(1 << 26).splitlines()
            if line.startswith("{") and '"event":"access"' in line
        ]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)  # polling the child's log, not timing a test


@pytest.mark.parametrize("clients", [1, 4])
def test_whole_streams_are_never_logged_as_client_aborts(
    llamacpp_upstream: RunningUpstream, tmp_path: Path, clients: int
) -> None:
    up = llamacpp_upstream
    guard = start(guard_spec("guard", up.base_url, _policy(tmp_path, up.tokenizer_json)))
    try:
        guard.wait_ready(60)
        reasons = asyncio.run(_streams(guard.url, up.model, STREAMS, clients))
        lines = _access_lines(guard, STREAMS)
    finally:
        guard.stop()
    assert sum(reasons.values()) == STREAMS  # every stream read to its [DONE]
    statuses = Counter(line["status"] for line in lines)
    assert statuses == {200: STREAMS}, (statuses, reasons)
    truncated = Counter(line.get("upstream_stream_truncated") for line in lines)
    assert set(truncated) <= {None, "no_finish_reason"}, truncated
    assert truncated["no_finish_reason"] == reasons[None], (truncated, reasons)
    whole = [line for line in lines if "upstream_stream_truncated" not in line]
    assert all(line["completion_tokens"] > 0 for line in whole)
    if clients == 1:  # one at a time: llama-cpp-python cuts none of them
        assert None not in reasons, reasons
