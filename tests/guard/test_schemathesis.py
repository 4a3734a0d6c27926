"""schemathesis against the guard's OpenAPI schema: no 5xx for anything it generates.

The guard (``schedguard serve``, a capped child process) sits in front of the hardened reference
scheduler (another one). schemathesis runs as its own command (``schemathesis run``, all
generation modes, the coverage and fuzzing phases) with the ``not_a_server_error`` check, twice:

- on the schema the guard publishes (``/openapi.json``): its own routes and the proxied ones,
  whose bodies it documents only as JSON objects, so most generated bodies stop at the checks;
- on the same schema with OpenAI-shaped request bodies for the proxied routes (model, messages,
  prompts, prompt templates, sampling fields, within and just past the guard's limits), so that
  generated requests also pass the checks and reach the upstream and come back through the guard.

Rate limits are off in the test policy: the generated traffic is judged by the checks, not by a
429. Bounded by ``--max-examples`` (fuzzing) and a fixed seed; each run takes a few seconds.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from schedguard.demo import ref_server
from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start

pytest.importorskip("schemathesis")

POLICY = """
upstream: {read_timeout_s: 10, total_timeout_s: 15}
rate: {requests_per_minute: null, tokens_per_minute: null}
"""
PROXIED = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"}
OWN = {"/guard/v1/check", "/healthz", "/readyz", "/metrics"}
MAX_EXAMPLES = 25
SEED = 20260101

# OpenAI request bodies, small enough that the upstream answers quickly. Fields a little past
# the guard's limits (top_logprobs, logprobs) and free-form template text are included on
# purpose: positive data that the guard must refuse with a 400, never a 5xx.
_MODEL = {"type": "string", "enum": ["schedguard-ref"]}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 200}
_SAMPLING: dict[str, Any] = {
    "model": _MODEL,
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
    "n": {"type": "integer", "minimum": 1, "maximum": 4},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer"},
    "stop": {
        "type": "array",
        "maxItems": 4,
        "items": {"type": "string", "minLength": 1, "maxLength": 8},
    },
    "stream": {"type": "boolean"},
    "stream_options": {
        "type": "object",
        "properties": {"include_usage": {"type": "boolean"}},
        "additionalProperties": False,
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "additionalProperties": False,
    "properties": {"role": {"enum": ["system", "user", "assistant"]}, "content": _TEXT},
}
CHAT_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "minItems": 1, "maxItems": 4, "items": _MESSAGE},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 8},
        "chat_template_kwargs": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "add_generation_prompt": {"type": "boolean"},
                "enable_thinking": {"type": "boolean"},
            },
        },
    },
}
_COMPLETION: dict[str, Any] = {
    **_SAMPLING,
    "echo": {"type": "boolean"},
    "logprobs": {"type": "integer", "minimum": 0, "maximum": 8},
}
COMPLETIONS_BODY: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "required": ["model", "prompt"],
            "properties": {
                **_COMPLETION,
                "prompt": {
                    "anyOf": [
                        _TEXT,
                        {"type": "array", "minItems": 1, "maxItems": 4, "items": _TEXT},
                    ]
                },
            },
        },
        {
            "type": "object",
            "required": ["model", "prompt_template"],
            "properties": {
                **_COMPLETION,
                "prompt_template": _TEXT,
                "template_vars": {
                    "type": "object",
                    "maxProperties": 4,
                    "additionalProperties": {"type": "string", "maxLength": 40},
                },
            },
        },
    ]
}
EMBEDDINGS_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _MODEL,
        "input": {
            "anyOf": [_TEXT, {"type": "array", "minItems": 1, "maxItems": 4, "items": _TEXT}]
        },
    },
}
OPENAI_BODIES = {
    "/v1/chat/completions": CHAT_BODY,
    "/v1/completions": COMPLETIONS_BODY,
    "/v1/embeddings": EMBEDDINGS_BODY,
}


@pytest.fixture(scope="module")
def guard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    policy = tmp_path_factory.mktemp("schemathesis") / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    upstream = start(ref_server("hardened", name="upstream"))
    guard: RunningServer | None = None
    try:
        upstream.wait_ready(30)
        guard = start(guard_spec("guard", upstream.url, policy))
        guard.wait_ready(30)
        yield guard.url
        assert guard.alive(), guard.log_tail()
        assert upstream.alive(), upstream.log_tail()
    finally:
        if guard is not None:
            guard.stop()
        upstream.stop()


@pytest.fixture(scope="module")
def published(guard_url: str) -> dict[str, Any]:
    resp = httpx.get(guard_url + "/openapi.json", timeout=10.0)
    assert resp.status_code == 200
    doc: dict[str, Any] = resp.json()
    return doc


def run_schemathesis(location: str, base_url: str, workdir: Path) -> tuple[int, int]:
    """``schemathesis run`` with only ``not_a_server_error``; (generated, passed) test cases."""
    argv = [
        sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()",
        "run", location, "--url", base_url,
        "--checks", "not_a_server_error",
        "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
        "--workers", "1", "--request-timeout", "20",
        "--suppress-health-check", "all", "--generation-database", "none",
        "--warnings", "off", "--no-color",
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=workdir, capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", output)
    assert counts is not None, output[-3000:]
    print(f"schemathesis on {Path(location).name}: {counts[0]}")
    return int(counts[1]), int(counts[2])


def test_published_schema_describes_the_proxied_routes(published: dict[str, Any]) -> None:
    paths = published["paths"]
    assert set(paths) >= PROXIED | OWN, sorted(paths)
    for route in PROXIED - {"/v1/models"}:
        post = paths[route]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["type"] == "object"
        assert "default" in post["responses"]  # the OpenAI error body
    assert "get" in paths["/v1/models"]


@pytest.mark.timeout(150)
def test_no_5xx_from_the_published_schema(guard_url: str, tmp_path: Path) -> None:
    generated, passed = run_schemathesis(guard_url + "/openapi.json", guard_url, tmp_path)
    assert generated == passed and generated >= 100, (generated, passed)


@pytest.mark.timeout(150)
def test_no_5xx_with_openai_request_bodies(
    guard_url: str, published: dict[str, Any], tmp_path: Path
) -> None:
    doc = copy.deepcopy(published)
    for route, body in OPENAI_BODIES.items():
        content = doc["paths"][route]["post"]["requestBody"]["content"]
        content["application/json"]["schema"] = body
    path = tmp_path / "openapi-openai-bodies.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    before = httpx.get(guard_url + "/metrics", timeout=10.0).text
    generated, passed = run_schemathesis(str(path), guard_url, tmp_path)
    assert generated == passed and generated >= 200, (generated, passed)
    # The generated requests did get through the guard to the upstream, not only to the checks.
    assert _forwarded_ok(httpx.get(guard_url + "/metrics", timeout=10.0).text) > _forwarded_ok(
        before
    )


def _forwarded_ok(metrics: str) -> float:
    """Requests the guard answered 200 on the proxied generation routes."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith("schedguard_guard_requests_total{") or 'status="200"' not in line:
            continue
        if any(f'"{r}"' in line for r in ("/v1/chat/completions", "/v1/completions")):
            total += float(line.rsplit(" ", 1)[1])
    return total
