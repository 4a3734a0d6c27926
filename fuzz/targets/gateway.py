"""Guard targets: the check pipeline on raw request bytes, and the FastAPI app over ASGI.

Input: an optional request head, then the body. When the input starts with ``METHOD /path``
(``POST /v1/completions``), that line and the ``name: value`` header lines up to a blank line
are the request head; otherwise the whole input is a ``POST /v1/chat/completions`` JSON body.

A finding on a guard target fails CI: the guard's checks are supposed to be linear in the input
and to refuse (with a stable code) rather than fail. ``request_check_failed`` (a check raised)
and a 500 ``internal_error`` from the app are crashes.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fuzz._exceptions import AppInternalError, CheckFailed
from fuzz.targets._base import Budgets, Cost
from fuzz.targets._common import TargetBase
from fuzz.targets._mutate import json_mutate
from guard.errors import GuardError

__all__ = ["GuardApp", "GuardPipeline", "RequestInput", "join_request", "split_request"]

_MIB = 1 << 20
DEFAULT_PATH = "/v1/chat/completions"
_HEAD = re.compile(rb"(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (/[!-~]*)\r?\n")


class RequestInput:
    __slots__ = ("body", "headers", "method", "path")

    def __init__(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body


def split_request(data: bytes) -> RequestInput:
    m = _HEAD.match(data)
    if m is None:
        return RequestInput("POST", DEFAULT_PATH, [], data)
    method = m.group(1).decode()
    path = m.group(2).decode("latin-1")
    rest = data[m.end() :]
    headers: list[tuple[str, str]] = []
    while rest:
        line, sep, after = rest.partition(b"\n")
        line = line.rstrip(b"\r")
        if not sep or not line:
            rest = after if sep else rest
            break
        name, colon, value = line.partition(b":")
        if not colon:
            break
        headers.append((name.strip().decode("latin-1"), value.strip().decode("latin-1")))
        rest = after
    return RequestInput(method, path, headers, rest)


def join_request(
    body: bytes, path: str = DEFAULT_PATH, headers: Sequence[tuple[str, str]] = ()
) -> bytes:
    if path == DEFAULT_PATH and not headers:
        return body
    head = f"POST {path}\n" + "".join(f"{k}: {v}\n" for k, v in headers) + "\n"
    return head.encode("latin-1", "replace") + body


# Request fields and the values a structure-aware mutation tries on them.
FIELDS: Mapping[str, Sequence[Any]] = {
    "model": ["schedguard-ref", "", "x" * 64],
    "messages": [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
    ],
    "prompt": ["hello", ["a", "b"], [1, 2, 3], [[1, 2]], ""],
    "prompt_template": ["{{system_prompt}}", "{{{{a}}}}", "{{a}}{{a}}"],
    "template_vars": [{"a": "{{b}}", "b": "x"}, {"a": "{{a}}"}],
    "chat_template": ["{% for i in range(9) %}x{% endfor %}", "{{ 'a' * 9 }}"],
    "chat_template_kwargs": [{"add_generation_prompt": True}, {"chat_template": "{{ 1 }}"}],
    "n": [1, 2, 128, 10**6, -1],
    "best_of": [1, 4, 100],
    "max_tokens": [1, 16, 4096, 10**9, -5],
    "max_completion_tokens": [1, 10**9],
    "min_tokens": [0, 10**6],
    "logprobs": [True, 5, 100],
    "top_logprobs": [0, 20, 10**4],
    "prompt_logprobs": [1, 1000],
    "logit_bias": [{"1": 1}, {str(i): 1 for i in range(40)}],
    "stop": ["x", ["a", "b"], ["x" * 64] * 8],
    "stream": [True, False],
    "stream_options": [{"include_usage": True}],
    "tools": [[{"type": "function", "function": {"name": "f", "parameters": {}}}]],
    "response_format": [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
    ],
    "guided_regex": ["a+", "(a+)+b", "(a|aa)*", "a{1000}{1000}", "[" * 8],
    "guided_json": [{"type": "object", "properties": {"a": {"$ref": "#"}}}],
    "guided_choice": [["a", "b"], ["x" * 100] * 50],
    "guided_grammar": ['root ::= "a" | root root', "root ::= (x*)*"],
    "structured_outputs": [{"regex": "(a*)*"}, {"json": {"type": "string"}}],
    "input": ["hi", ["a", "b"], [[1, 2, 3]]],
    "temperature": [0.0, 1e308, -1],
}
_SEEDS = (
    b'{"model":"schedguard-ref","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}',
    b'{"model":"schedguard-ref","prompt":"Hello","max_tokens":8}',
    b'POST /v1/completions\n\n{"model":"schedguard-ref","prompt":"Say hi","n":1}',
    b'POST /v1/embeddings\n\n{"model":"schedguard-ref","input":["a","b"]}',
)
_DICTIONARY = (
    b'"messages"',
    b'"content"',
    b'"role"',
    b'"user"',
    b'"prompt"',
    b'"n"',
    b'"max_tokens"',
    b'"guided_regex"',
    b'"chat_template"',
    b'"prompt_template"',
    b'"logit_bias"',
    b'"stop"',
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b":",
    b"null",
    b"true",
    b"1e999",
    b"\\u0000",
    b"\\ud800",
    b"{{",
    b"}}",
    b"POST /v1/completions\n\n",
    b"POST /v1/embeddings\n\n",
)


class _GuardBase(TargetBase):
    kind = "guard"
    expected = (GuardError,)
    endpoint = DEFAULT_PATH
    class_ = "json_body_bomb"
    target_field = "body"
    max_size = 8192
    isolate_by_default = False
    _seeds = _SEEDS
    _dictionary = _DICTIONARY
    # Linear checks: 1 s of CPU or 64 MiB for one input of at most a few KiB is a bug, and so is
    # more than 0.5 ms of work per input byte (a 64-byte floor, see Cost.per_byte).
    budgets = Budgets(wall_s=1.0, mem_bytes=64 * _MIB, cost_per_byte=0.5)

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        req = split_request(data)
        body = json_mutate(req.body, max_size, rng, fields=FIELDS, dictionary=self._dictionary)
        if rng.random() < 0.05:
            path = rng.choice(("/v1/completions", "/v1/embeddings", DEFAULT_PATH, "/v1/models"))
            out = join_request(body, path, req.headers)
        else:
            out = join_request(body, req.path, req.headers) if req.path != DEFAULT_PATH else body
            if req.method != "POST" or req.headers:
                head = data[: len(data) - len(req.body)]
                out = head + body
        return out if len(out) <= max_size else data

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        req = split_request(data)
        return req.body, req.path

    def input_from_payload(
        self, body: bytes, endpoint: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes | None:
        return join_request(body, endpoint, headers)


class GuardPipeline(_GuardBase):
    source = "guard/pipeline.py"
    name = "guard-pipeline"
    description = "the guard's checks on raw request bytes (route, key, bounded JSON, checks)"
    exercises = "guard.pipeline.evaluate_body(raw, path, headers, load_policy(None))"

    def __init__(self) -> None:
        self._policy: Any = None

    def _get_policy(self) -> Any:
        if self._policy is None:
            from guard.policy import load_policy

            self._policy = load_policy(None)
        return self._policy

    def execute(self, data: bytes) -> Cost:
        from guard.pipeline import CHECK_FAILED, evaluate_body

        req = split_request(data)
        verdict = evaluate_body(
            req.body, req.path, req.headers, self._get_policy(), method=req.method
        )
        if verdict.rejection is not None:
            if verdict.rejection.code == CHECK_FAILED:
                raise CheckFailed(verdict.rejection.message)
            raise verdict.rejection
        # The guard's own work: the prompt tokens it counted (what it reserves for the upstream,
        # max_tokens x n, is the policy's business, not a cost of checking).
        return Cost(steps=int(verdict.costs.get("prompt_tokens", 0)))


class GuardApp(_GuardBase):
    source = "guard/app.py"
    name = "guard-app"
    description = "the guard's FastAPI app in process over ASGI, with a stub upstream"
    exercises = "guard.app.create_app(policy) called as an ASGI app; upstream stubbed"
    # An ASGI round trip through the app costs more than the bare pipeline.
    budgets = Budgets(wall_s=1.0, mem_bytes=64 * _MIB, cost_per_byte=1.0)

    def __init__(self) -> None:
        self._app: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get_app(self) -> tuple[Any, asyncio.AbstractEventLoop]:
        if self._app is None or self._loop is None:
            from guard.app import create_app
            from guard.policy import policy_from_yaml
            from guard.telemetry import AccessLog

            # Rate limits and the compile budget's global caps off: one fuzzing client would
            # otherwise only ever see 429s and 503s.
            policy = policy_from_yaml(
                "upstream:\n  url: http://upstream.invalid\n"
                "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
                "  guided_compile_s_per_minute: null\n"
                "limits:\n  guided:\n    upstream_compile_workers: 1000000\n"
                "    max_cold_compiles_per_s: 1000000\n"
            )
            app = create_app(policy, access_log=AccessLog(False))
            app.state.gateway.upstream = _StubUpstream()
            self._app = app
            self._loop = asyncio.new_event_loop()
        return self._app, self._loop

    def execute(self, data: bytes) -> Cost:
        app, loop = self._get_app()
        req = split_request(data)
        status, body = loop.run_until_complete(_call(app, req))
        if status >= 400:
            code = _error_code(body)
            if status == 500 and code in ("internal_error", None):
                raise AppInternalError(f"{status} {body[:300]!r}")
            raise GuardError(code or f"http_{status}", f"status {status}", status=status)
        return Cost(steps=len(body))


def _error_code(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        code = doc["error"].get("code")
        return code if isinstance(code, str) else None
    return None


async def _call(app: Any, req: RequestInput) -> tuple[int, bytes]:
    path, _, query = req.path.partition("?")
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in req.headers]
    if not any(k == b"content-type" for k, _ in headers):
        headers.append((b"content-type", b"application/json"))
    if not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(req.body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": req.method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("latin-1", "replace"),
        "query_string": query.encode("latin-1", "replace"),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = [500]
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)  # as a client that keeps the connection open
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": req.body, "more_body": False}

    async def send(message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = int(message["status"])
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return status[0], b"".join(parts)


_STUB_BODY = json.dumps(
    {
        "id": "cmpl-stub",
        "object": "chat.completion",
        "model": "schedguard-ref",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


class _StubResponse:
    status = 200
    content_type = "application/json"
    is_event_stream = False

    raw_headers = ((b"Content-Type", b"application/json"),)

    def __init__(self) -> None:
        from multidict import CIMultiDict

        self.headers = CIMultiDict({"content-type": "application/json"})
        self.content_length = len(_STUB_BODY)

    async def read(self, max_bytes: int) -> bytes:
        return _STUB_BODY

    async def chunks(self) -> AsyncIterator[bytes]:
        yield _STUB_BODY

    def abort(self) -> None:
        return None

    def release(self) -> None:
        return None


class _StubUpstream:
    """Answers every forwarded request with one small completion, at once."""

    async def send(self, *args: Any, **kwargs: Any) -> _StubResponse:
        return _StubResponse()

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None
