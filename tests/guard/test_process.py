"""End to end: the real ``openai`` client through the guard to the reference scheduler (a child
process ``schedguard ref --profile hardened`` under a memory cap), plain and streaming; and
``schedguard serve --embedded-reference`` (its embedded upstream started and stopped with it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import psutil
import pytest

from guard.app import create_app
from guard.policy import policy_from_yaml
from schedguard.demo import ref_server
from schedguard.servers import RunningServer, free_port, schedguard_argv
from tests._guard_harness import serve

MODEL = "schedguard-ref"
MEM_LIMIT = 2 << 30


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    port = free_port("127.0.0.1")
    server = RunningServer(
        ref_server("hardened"), {"scheduler_ref": port}, "127.0.0.1", mem_limit_bytes=MEM_LIMIT
    )
    try:
        server.wait_ready(30)
        yield server.url
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def client_through_guard(upstream: str) -> AsyncIterator[openai.AsyncOpenAI]:
    app = create_app(policy_from_yaml(""), upstream_url=upstream)
    async with serve(app) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-anything", max_retries=0)
        try:
            yield client
        finally:
            await client.close()


async def test_openai_client_plain(reference: str) -> None:
    async with client_through_guard(reference) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 8
        text = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4)
        assert text.choices[0].text and text.choices[0].finish_reason in ("length", "stop")


async def test_openai_client_streaming(reference: str) -> None:
    async with client_through_guard(reference) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces: list[str] = []
        finish = None
        usage = None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(pieces) and finish in ("length", "stop")
        assert usage is not None and usage.completion_tokens <= 6
        stream2 = await client.completions.create(
            model=MODEL, prompt="abc", max_tokens=3, stream=True
        )
        texts = [c.choices[0].text async for c in stream2 if c.choices]
        assert "".join(texts)


async def test_openai_client_sees_the_guards_and_the_upstreams_errors(reference: str) -> None:
    async with client_through_guard(reference) as client:
        with pytest.raises(openai.BadRequestError) as exc:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], n=1000
            )
        assert exc.value.code == "n_exceeded"
        with pytest.raises(openai.BadRequestError) as exc:
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                extra_body={"chat_template": "{% for i in range(10**9) %}x{% endfor %}"},
            )
        assert exc.value.code == "chat_template_not_allowed"
        with pytest.raises(openai.NotFoundError) as nf:  # the upstream's own answer, relayed
            await client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        assert nf.value.code == "model_not_found"


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"serve exited with {proc.returncode}"
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url + "/readyz").status_code == 200:
                    return
            time.sleep(0.1)  # polling a child's startup, not timing a test
    raise AssertionError("schedguard serve did not become ready")


def test_schedguard_serve_embedded_reference_starts_and_stops_its_upstream() -> None:
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        schedguard_argv(
            "serve", "--embedded-reference", "--port", str(port), "--log-level", "warning"
        ),
        env={k: v for k, v in os.environ.items() if not k.startswith(("SCHEDGUARD_", "OTEL_"))},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, 40)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("ref" in " ".join(c.cmdline()) for c in children)
        resp = httpx.post(
            url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
        _gone, alive = psutil.wait_procs(children, timeout=5)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def test_policy_show_names_invalid_fields() -> None:
    env = {**os.environ, "SCHEDGUARD_RATE__BURST": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "schedguard", "policy", "show"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "rate.burst" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "schedguard", "policy", "show", "--json"],
        env={**os.environ, "SCHEDGUARD_RATE__BURST": "7"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0 and '"burst": 7' in result.stdout
