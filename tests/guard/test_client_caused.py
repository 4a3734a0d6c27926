"""Whatever a client sends, the guard answers it 4xx, never 5xx, unless the upstream failed
(issue 14 item 3): the path, its percent-decoding, the query, model ids and the headers
forwarded, over real sockets to a real guard (uvicorn, the guard's protocol) in front of a fake
upstream that never fails.

The fake upstream answers every request it gets; the guard's ``/metrics`` must then show no
5xx and no upstream failure, and whatever reached the upstream must be what the guard judged
(a model id arrives as the id the guard saw, whatever the client's spelling).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import quote, unquote

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.app import create_app
from guard.policy import policy_from_yaml
from guard.routing import MAX_MODEL_ID_BYTES, upstream_target
from tests._guard_harness import FakeUpstream, bound_socket, serve

POLICY = policy_from_yaml("observability: {access_log: false}")


class _Upstream(FakeUpstream):
    """The harness's fake upstream, with model ids that hold slashes (``org/name``)."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get(r"/v1/models/{model:.+}", self._model)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/embeddings", self._generate)
        return app


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[_Upstream]:
    fake = _Upstream()
    runner = web.AppRunner(fake.app(), handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    sock = bound_socket()
    await web.SockSite(runner, sock).start()
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield fake
    finally:
        await runner.cleanup()


@dataclass
class Running:
    url: str
    fake: FakeUpstream
    loop: asyncio.AbstractEventLoop

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)


@pytest.fixture(scope="module")
def guard() -> Iterator[Running]:
    """The guard and its fake upstream on a loop of their own, in a thread, for the module."""
    ready: dict[str, Running] = {}
    started = threading.Event()
    stop: asyncio.Future[None] | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.get_running_loop().create_future()
        async with upstream() as fake:
            app = create_app(POLICY, upstream_url=fake.url)
            async with serve(app) as url:
                ready["guard"] = Running(url, fake, asyncio.get_running_loop())
                started.set()
                await stop

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(30), "the guard did not start"
    running = ready["guard"]
    yield running
    assert stop is not None
    running.loop.call_soon_threadsafe(stop.set_result, None)
    thread.join(10)


@dataclass(frozen=True)
class Answer:
    status: int
    code: str | None
    body: bytes


def request(address: tuple[str, int], head: bytes, timeout: float = 10.0) -> Answer:
    """One request over its own connection (``connection: close``); the whole answer."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(head)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    parts = status_line.split(b" ")
    assert len(parts) >= 2 and parts[1].isdigit(), f"no HTTP answer: {data[:200]!r}"
    body = rest.partition(b"\r\n\r\n")[2]
    code = None
    with contextlib.suppress(ValueError, KeyError, TypeError):
        code = json.loads(body)["error"]["code"]
    return Answer(int(parts[1]), code, body)


def get(address: tuple[str, int], target: bytes, headers: bytes = b"") -> Answer:
    return request(
        address,
        b"GET " + target + b" HTTP/1.1\r\nhost: g\r\nconnection: close\r\n" + headers + b"\r\n",
    )


def metrics(address: tuple[str, int]) -> str:
    return get(address, b"/metrics").body.decode()


def server_errors(text: str) -> list[str]:
    """Lines of the metrics that count a 5xx answer or an upstream failure."""
    return [
        line
        for line in text.splitlines()
        if re.match(r'schedguard_guard_requests_total\{.*status="5\d\d"', line)
        or re.match(r'schedguard_guard_rejections_total\{code="upstream_[a-z_]+"', line)
    ]


# -------------------------------------------------------------------- the reported cases


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/models/%0d%0aX-Injected:%201",  # CR LF: would split the upstream request
        b"/v1/models/a%0ab",
        b"/v1/models/a%00b",  # NUL
        b"/v1/models/%FF",  # not UTF-8: decodes to U+FFFD
        b"/v1/models/%C3%28",  # an invalid two-byte sequence
        b"/v1/models/%c2%85",  # U+0085 (NEL), a C1 control
        b"/v1/models/a%5cb",  # a backslash
        b"/v1/models/..",
        b"/v1/models/../../metrics",  # dot segments a normalising upstream resolves
        b"/v1/models/%2e%2e/%2e%2e/health",
        b"/v1/models/a//b",
        b"/v1/models/a/",
        b"/v1/models/%2F",
        b"/v1/models/" + b"m" * (MAX_MODEL_ID_BYTES + 1),
        b"/v1/models/" + b"%E2%82%AC" * 100,  # 300 bytes once decoded
    ],
)
def test_unsendable_model_paths_are_400_invalid_path(guard: Running, target: bytes) -> None:
    before = len(guard.fake.received)
    answer = get(guard.address, target)
    assert (answer.status, answer.code) == (400, "invalid_path"), answer.body
    assert len(guard.fake.received) == before  # nothing reached the upstream


@pytest.mark.parametrize(
    ("target", "model"),
    [
        (b"/v1/models/%E2%82%AC", "\u20ac"),  # outside Latin-1: was a 502
        (b"/v1/models/caf%C3%A9", "caf\u00e9"),
        (b"/v1/models/meta-llama/Llama-3-8B", "meta-llama/Llama-3-8B"),
        (b"/v1/models/meta-llama%2FLlama-3-8B", "meta-llama/Llama-3-8B"),
        (b"/v1/models/a%20b%3Fc%23d%25e", "a b?c#d%e"),
        (b"/v1/models/tiny-llama?x=1", "tiny-llama"),
        (b"/v1/models/v1.2_q4:latest", "v1.2_q4:latest"),
    ],
)
def test_model_ids_reach_the_upstream_as_the_guard_saw_them(
    guard: Running, target: bytes, model: str
) -> None:
    answer = get(guard.address, target)
    assert answer.status == 200, answer.body
    received = guard.fake.received[-1]
    assert unquote(received.path) == "/v1/models/" + model


def test_the_query_is_forwarded_as_it_came(guard: Running) -> None:
    assert get(guard.address, b"/v1/models?a=%00&b=%E2%82%AC&c").status == 200
    assert get(guard.address, b"/v1/models#fragment").status == 200


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/models/\xc3\xa9 HTTP/1.1\r\nhost: g\r\n\r\n",  # raw UTF-8 in the target
        b"GET /v1/models?a=\xff HTTP/1.1\r\nhost: g\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: g\r\nx-a: a\x00b\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: g\r\nx-a: a\rb\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: g\r\nx-a: a\x01b\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: g\r\nx-a\x80: b\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: g\r\nx-a: b\r\n folded\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: g\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
        b"GET /v1/mo dels HTTP/1.1\r\nhost: g\r\n\r\n",
    ],
)
def test_heads_httptools_refuses_get_a_json_400(guard: Running, head: bytes) -> None:
    answer = request(guard.address, head)
    assert (answer.status, answer.code) == (400, "invalid_http_request"), answer.body


def test_obs_text_headers_are_forwarded(guard: Running) -> None:
    """A header value with bytes 0x80-0xFF (obs-text) is valid HTTP: forwarded as it is."""
    assert get(guard.address, b"/v1/models", b"x-note: caf\xe9\r\n").status == 200
    assert guard.fake.received[-1].headers["x-note"].encode("latin-1", "replace") in (
        b"caf\xe9",
        b"caf?",
    )


def test_the_dry_run_says_invalid_path_too(guard: Running) -> None:
    head = (
        b"POST /guard/v1/check?path=/v1/models/%0d%0a HTTP/1.1\r\nhost: g\r\n"
        b"connection: close\r\ncontent-length: 0\r\n\r\n"
    )
    answer = request(guard.address, head)
    assert (answer.status, answer.code) == (400, "invalid_path"), answer.body


def test_unit_upstream_target() -> None:
    assert upstream_target("/v1/chat/completions", "/v1/chat/completions") == (
        "/v1/chat/completions"
    )
    assert upstream_target("/v1/models/{model}", "/v1/models/a b") == "/v1/models/a%20b"


# ------------------------------------------------------------------------ property: no 5xx

_PREFIXES = [
    "/v1/models/",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/",
    "/",
    "/guard/v1/check",
    "/metrics/",
]
# Any text, controls, separators and dots weighed in.
_TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["/", ".", "..", "%", "\\", "\r", "\n", "\0", "?", "#", ";", "\x85"]),
    ),
    max_size=30,
).map("".join)
_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~", min_size=1)
# Header values httptools accepts: visible ASCII, space, tab, obs-text.
_VALUE = st.binary(max_size=60).map(
    lambda b: bytes(c for c in b if c == 9 or 0x20 <= c <= 0x7E or c >= 0x80).strip(b" \t")
)
_NOT_SENT_BY_NAME = {
    b"host",
    b"content-length",
    b"transfer-encoding",
    b"connection",
    b"expect",
    b"upgrade",
    b"content-encoding",
    b"authorization",
}


@st.composite
def _targets(draw: st.DrawFn) -> bytes:
    prefix = draw(st.sampled_from(_PREFIXES))
    tail = draw(_TEXT)
    how = draw(st.sampled_from(["quote", "quote-all", "raw-ascii"]))
    if how == "quote":
        encoded = quote(tail, safe="/.%;:@")
    elif how == "quote-all":
        encoded = quote(tail, safe="")
    else:
        encoded = "".join(c for c in tail if 0x21 <= ord(c) <= 0x7E and c not in "#?")
    query = draw(st.one_of(st.just(""), _TEXT.map(lambda t: "?" + quote(t, safe="=&"))))
    return (prefix + encoded + query).encode("ascii")


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    target=_targets(),
    method=st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE"]),
    headers=st.lists(st.tuples(_TOKEN, _VALUE), max_size=6),
)
def test_no_client_input_makes_a_5xx(
    guard: Running, target: bytes, method: bytes, headers: list[tuple[str, bytes]]
) -> None:
    lines = b"".join(
        name.encode() + b": " + value + b"\r\n"
        for name, value in headers
        if name.lower().encode() not in _NOT_SENT_BY_NAME
    )
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
    framing = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    head = method + b" " + target + b" HTTP/1.1\r\nhost: g\r\nconnection: close\r\n"
    answer = request(guard.address, head + lines + (framing + b"\r\n" + body))
    assert answer.status < 500, (target, headers, answer.body[:300])
    if answer.status >= 400:
        assert answer.code is not None and re.fullmatch(r"[a-z_]+", answer.code), answer.body


def test_after_all_that_no_5xx_and_no_upstream_failure_was_counted(guard: Running) -> None:
    """Runs after the cases above (file order): the metrics agree with the answers."""
    assert get(guard.address, b"/v1/models/%0d%0a").status == 400
    assert server_errors(metrics(guard.address)) == []
