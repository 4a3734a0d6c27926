"""The context window in force (issue 14 item 7): the policy's when it sets one, else the one
the upstream's ``/v1/models`` reports (vLLM's ``max_model_len``), read at start-up and again on
readiness, else the default; ``/readyz``, the dry run and ``schedguard policy show --upstream``
say which. Real HTTP: a fake upstream and the guard served by uvicorn."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from guard.app import create_app
from guard.checks import DEFAULT_CONTEXT_LENGTH
from guard.http import max_model_len_of, upstream_kind_of
from guard.policy import policy_from_yaml
from schedguard.cli import main as cli_main
from tests._guard_harness import FakeUpstream, fake_upstream, serve

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.asynccontextmanager
async def _guard(
    policy_yaml: str, models: dict[str, Any]
) -> AsyncIterator[tuple[httpx.AsyncClient, FakeUpstream]]:
    async with fake_upstream() as fake:
        fake.models.update(models)
        app = create_app(policy_from_yaml(policy_yaml), upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, fake


async def _check(client: httpx.AsyncClient, max_tokens: int) -> dict[str, Any]:
    resp = await client.post("/guard/v1/check", json={**CHAT, "max_tokens": max_tokens})
    assert resp.status_code == 200
    result: dict[str, Any] = resp.json()
    return result


async def test_upstream_max_model_len_is_in_force_when_the_policy_sets_none() -> None:
    async with _guard("{}", {"max_model_len": 1024}) as (client, fake):
        ready = (await client.get("/readyz")).json()
        assert ready["context_length"] == 1024
        assert ready["context_length_source"] == "upstream"
        # 1000 output tokens + the prompt do not fit 1024, though they fit the default 4096.
        verdict = await _check(client, 1000)
        assert verdict["code"] == "context_length_exceeded"
        assert verdict["context_length_source"] == "upstream"
        assert (await _check(client, 500))["allowed"] is True
        # The guard's own model-list requests are marked, and were made (start-up, readiness).
        assert "/v1/models" in fake.probes
        assert not fake.received


async def test_policy_value_wins_over_the_upstream() -> None:
    policy = "limits: {tokens: {context_length: 8192}}"
    async with _guard(policy, {"max_model_len": 1024}) as (client, _):
        ready = (await client.get("/readyz")).json()
        assert (ready["context_length"], ready["context_length_source"]) == (8192, "policy")
        assert (await _check(client, 2000))["allowed"] is True


async def test_auto_in_the_policy_means_the_upstream() -> None:
    policy = "limits: {tokens: {context_length: auto}}"
    async with _guard(policy, {"max_model_len": 2048}) as (client, _):
        ready = (await client.get("/readyz")).json()
        assert (ready["context_length"], ready["context_length_source"]) == (2048, "upstream")


async def test_an_upstream_without_max_model_len_leaves_the_default() -> None:
    async with _guard("{}", {}) as (client, _):
        ready = (await client.get("/readyz")).json()
        assert ready["context_length"] == DEFAULT_CONTEXT_LENGTH
        assert ready["context_length_source"] == "default"


async def test_readiness_probes_keep_the_policy_while_the_upstream_says_the_same() -> None:
    async with fake_upstream() as fake:
        fake.models.update({"max_model_len": 1024})
        app = create_app(policy_from_yaml("{}"), upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            await client.get("/readyz")
            policy = app.state.gateway.policy
            for _ in range(3):
                assert (await client.get("/readyz")).json()["context_length"] == 1024
            assert app.state.gateway.policy is policy  # not rebuilt on every probe
            fake.models["max_model_len"] = 2048
            await client.get("/readyz")
            assert app.state.gateway.policy is not policy


async def test_a_restarted_upstream_with_another_window_is_noticed_on_readiness() -> None:
    async with _guard("{}", {"max_model_len": 1024}) as (client, fake):
        assert (await client.get("/readyz")).json()["context_length"] == 1024
        fake.models["max_model_len"] = 3000
        ready = (await client.get("/readyz")).json()
        assert ready["context_length"] == 3000
        assert (await _check(client, 2000))["allowed"] is True


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"data": [{"id": "m", "max_model_len": 4096}, {"id": "lora"}]}, 4096),
        ({"data": [{"max_model_len": 8192}, {"max_model_len": 2048}]}, 2048),
        ({"data": [{"max_model_len": 0}, {"max_model_len": -5}]}, None),
        ({"data": [{"max_model_len": "4096"}, {"max_model_len": True}]}, None),
        ({"data": [{"max_model_len": 1e9}]}, None),
        ({"data": "x"}, None),
        ([], None),
        (None, None),
    ],
)
def test_max_model_len_of(doc: Any, expected: int | None) -> None:
    assert max_model_len_of(doc) == expected


@contextlib.contextmanager
def _models_server(doc: dict[str, Any]) -> Iterator[str]:
    body = json.dumps(doc).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_policy_show_says_which_window_is_in_force(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["policy", "show"]) == 0
    assert "# context window in force: 4096 tokens (the default" in capsys.readouterr().out
    with _models_server({"data": [{"id": "m", "max_model_len": 1536}]}) as url:
        assert cli_main(["policy", "show", "--upstream", url, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["context_window"] == {
            "context_length": 1536,
            "source": "upstream",
            "upstream": url,
            "upstream_kind": "other",
        }
        assert doc["policy"]["limits"]["tokens"]["context_length"] == 1536
        assert cli_main(["policy", "show", "--upstream", url]) == 0
        out = capsys.readouterr().out
        assert out.endswith(
            "# context window in force: 1536 tokens (the upstream's /v1/models max_model_len)\n"
            "# upstream kind in force: other\n"
        )
    with _models_server({"data": [{"id": "m", "owned_by": "me"}]}) as url:
        assert cli_main(["policy", "show", "--upstream", url, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["context_window"]["upstream_kind"] == "llama_cpp"
        assert doc["policy"]["upstream"]["kind"] == "llama_cpp"


async def test_llama_cpp_schema_check_is_off_in_front_of_vllm_only() -> None:
    # A named tool with a date pattern: llama-cpp-python's converter copies `\d` into a grammar
    # llama.cpp cannot parse (it crashes), vLLM compiles it itself.
    params = {"type": "object", "properties": {"d": {"type": "string", "pattern": r"^\d{4}$"}}}
    body = {
        **CHAT,
        "max_tokens": 8,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }
    async with _guard("{}", {"owned_by": "vllm"}) as (client, _):
        assert (await client.get("/readyz")).json()["llama_cpp_schemas"] is False
        verdict = (await client.post("/guard/v1/check", json=body)).json()
        assert verdict["allowed"] is True, verdict
    async with _guard("{}", {"owned_by": "me"}) as (client, _):
        assert (await client.get("/readyz")).json()["llama_cpp_schemas"] is True
        verdict = (await client.post("/guard/v1/check", json=body)).json()
        assert verdict["code"] == "guided_schema_grammar_invalid", verdict
    policy = "limits: {guided: {llama_cpp_schemas: true}}"
    async with _guard(policy, {"owned_by": "vllm"}) as (client, _):
        verdict = (await client.post("/guard/v1/check", json=body)).json()
        assert verdict["code"] == "guided_schema_grammar_invalid", verdict


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"data": [{"id": "a", "owned_by": "vllm"}, {"id": "b", "owned_by": "vllm"}]}, "vllm"),
        ({"data": [{"id": "a", "owned_by": "me"}]}, "llama_cpp"),
        ({"data": [{"id": "a", "owned_by": "me"}, {"id": "b", "owned_by": "vllm"}]}, "other"),
        ({"data": [{"id": "a", "owned_by": "openai"}]}, "other"),
        ({"data": []}, "other"),
        ({"data": "me"}, "other"),
        (None, "other"),
    ],
)
def test_upstream_kind_of(doc: Any, expected: str) -> None:
    assert upstream_kind_of(doc) == expected


# What llama-cpp-python 0.3.36 answers with a pydantic 500, and what it serves.
_NULL_CONTENT = {
    "model": "fake",
    "max_tokens": 8,
    "messages": [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ],
}


async def test_llama_cpp_upstream_is_detected_and_its_500s_are_refused() -> None:
    async with _guard("{}", {"owned_by": "me"}) as (client, fake):
        ready = (await client.get("/readyz")).json()
        assert ready["upstream_kind"] == "llama_cpp"
        resp = await client.post("/v1/chat/completions", json=_NULL_CONTENT)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "unsupported_by_upstream"
        assert error["param"] == "messages[1].content"
        verdict = (await client.post("/guard/v1/check", json=_NULL_CONTENT)).json()
        assert verdict["code"] == "unsupported_by_upstream"
        assert verdict["upstream_kind"] == "llama_cpp"
        prompts = {"model": "fake", "prompt": ["a", "b"], "max_tokens": 4}
        resp = await client.post("/v1/completions", json=prompts)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "prompts_exceeded"
        assert not fake.received
        served = {**_NULL_CONTENT, "messages": [_NULL_CONTENT["messages"][0]]}
        resp = await client.post("/v1/chat/completions", json=served)
        assert resp.status_code == 200, resp.text


async def test_other_upstreams_get_what_llama_cpp_refuses() -> None:
    async with _guard("{}", {"owned_by": "vllm"}) as (client, _):
        assert (await client.get("/readyz")).json()["upstream_kind"] == "vllm"
        verdict = (await client.post("/guard/v1/check", json=_NULL_CONTENT)).json()
        assert verdict["allowed"] is True, verdict
    # Named in the policy, the kind wins over what /v1/models says.
    async with _guard("upstream: {kind: llama_cpp}", {"owned_by": "vllm"}) as (client, _):
        ready = (await client.get("/readyz")).json()
        assert ready["upstream_kind"] == "llama_cpp"
        assert ready["llama_cpp_schemas"] is True
        verdict = (await client.post("/guard/v1/check", json=_NULL_CONTENT)).json()
        assert verdict["code"] == "unsupported_by_upstream", verdict
    async with _guard("upstream: {kind: vllm}", {"owned_by": "me"}) as (client, _):
        ready = (await client.get("/readyz")).json()
        assert ready == {**ready, "upstream_kind": "vllm", "llama_cpp_schemas": False}
        verdict = (await client.post("/guard/v1/check", json=_NULL_CONTENT)).json()
        assert verdict["allowed"] is True, verdict
