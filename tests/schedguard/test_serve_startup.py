"""``schedguard serve`` says the policy in force when it starts: the upstream's window and where it
came from, the caps, keys, preset (issue 19)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import httpx

from guard.context_window import policy_summary
from guard.policy import default_policy, policy_from_yaml
from schedguard.servers import free_port, schedguard_argv
from tests._guard_harness import fake_upstream


def test_the_summary_says_the_window_caps_keys_and_preset() -> None:
    line = policy_summary(default_policy().with_upstream_context(32_768), "upstream")
    assert "preset default" in line
    assert "context window 32768 tokens (the upstream's /v1/models max_model_len)" in line
    assert "prompt cap the window" in line and "nothing injected" in line
    assert "no API keys" in line
    seed = policy_from_yaml("{preset: seed, keys: [{key: a-long-key-1, tenant: t}]}")
    line = policy_summary(seed, "default")
    assert "preset seed" in line and "prompt cap 2048" in line
    assert "256 injected when a request sets none" in line
    assert "1 API key(s) required" in line
    assert "(the default: the upstream reports none)" in line


async def test_serve_prints_the_policy_in_force_at_start() -> None:
    async with fake_upstream() as fake:
        fake.models = {"max_model_len": 32_768, "owned_by": "vllm"}
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDGUARD_")}
        port = free_port("127.0.0.1")
        argv = schedguard_argv(
            "serve", "--upstream", fake.url, "--port", str(port), "--log-level", "warning"
        )
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        try:
            assert proc.stderr is not None
            lines: list[str] = []
            async with asyncio.timeout(60):  # an outer bound on the child's start, not a timing
                while not any("policy in force" in line for line in lines):
                    raw = await proc.stderr.readline()
                    assert raw, "".join(lines)
                    lines.append(raw.decode())
            said = next(line for line in lines if "policy in force" in line)
            assert "context window 32768 tokens (the upstream's /v1/models max_model_len)" in said
            assert "upstream kind vllm" in said and "preset default" in said
            # Stopped once it serves: the fake upstream lives on this test's loop, and the
            # guard's start-up asks it for its model list.
            async with httpx.AsyncClient(timeout=5) as client, asyncio.timeout(60):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"http://127.0.0.1:{port}/readyz")).is_success:
                            break
                    await asyncio.sleep(0.1)  # polling a child's start, not timing a test
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            await proc.wait()
