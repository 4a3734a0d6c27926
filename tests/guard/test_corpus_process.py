"""Every corpus payload through a real ``schedguard serve`` to the *vulnerable* reference
scheduler, which must come out of it healthy.

Both servers are child processes under a 1 GiB ``RLIMIT_AS``. Pipeline-layer payloads are sent
with httpx (their headers, their raw bytes); HTTP-layer ones over a raw socket, as the file
describes them (generated headers, encodings, chunked or stalled bodies, a slow sender), with
the answer read while the body is still being sent, since the guard answers early and hangs up.
Flood-tagged payloads are sent many times, each under an API key with small limits, and must
get their 429. The test policy differs from the default only where the test needs it: a 1 s
body timeout (the slow-loris payload would otherwise take 10 s), one unlimited key for the
single payloads and one small-limit key per flood.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from loadtests.upstream_corpus import corpus_routes
from payloads.loader import Payload, Transport, load_corpus
from schedguard._servers import RunningServer
from schedguard.demo import ref_server
from tests._guard_process import guard_spec, start

MiB = 1 << 20
MAX_UPSTREAM_GROWTH = 48 * MiB  # "a few tens of MB": allocator arenas, caches; not the payloads

MAIN_KEY = "sk-corpus-main-000001"
FLOOD_KEYS = {
    "rate_limited_requests": "sk-corpus-flood-requests",
    "rate_limited_tokens": "sk-corpus-flood-tokens",
    "concurrency_limited": "sk-corpus-flood-streams",
}
POLICY = f"""
upstream: {{read_timeout_s: 15, total_timeout_s: 20}}
limits:
  body: {{body_read_timeout_s: 1.0}}
rate:
  queue_size: 0  # a request over its key's concurrency is refused at once, never queued
keys:
  - key: {MAIN_KEY}
    tenant: corpus
    rate: {{requests_per_minute: null, tokens_per_minute: null, burst: 100000}}
  - key: {FLOOD_KEYS["rate_limited_requests"]}
    tenant: flood-requests
    rate: {{requests_per_minute: 6, burst: 3, tokens_per_minute: null}}
  - key: {FLOOD_KEYS["rate_limited_tokens"]}
    tenant: flood-tokens
    rate: {{requests_per_minute: null, tokens_per_minute: 40000}}
  - key: {FLOOD_KEYS["concurrency_limited"]}
    tenant: flood-streams
    rate: {{requests_per_minute: null, tokens_per_minute: null, per_key_concurrency: 1}}
"""

CORPUS = load_corpus()
SINGLE = [p for p in CORPUS if "flood" not in p.tags]
FLOOD = [p for p in CORPUS if "flood" in p.tags]


@dataclass(frozen=True)
class Deployment:
    upstream: RunningServer
    guard: RunningServer


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    policy = tmp_path_factory.mktemp("corpus-e2e") / "policy.yaml"
    # The routes the corpus needs proxied besides the defaults (vLLM's pooling and scoring).
    routes = f"routes: [{', '.join(corpus_routes(CORPUS))}]\n"
    policy.write_text(POLICY + routes, encoding="utf-8")
    upstream = start(ref_server("vulnerable", name="upstream"))
    guard: RunningServer | None = None
    try:
        upstream.wait_ready(30)
        guard = start(guard_spec("guard", upstream.url, policy))
        guard.wait_ready(30)
        yield Deployment(upstream, guard)
    finally:
        if guard is not None:
            guard.stop()
        upstream.stop()


# ------------------------------------------------------------------------------ sending


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: the connection ended without a status line
    headers: dict[str, str]
    body: bytes

    @property
    def code(self) -> str | None:
        if self.status is not None and 200 <= self.status < 300:
            return "ok"
        try:
            err = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            return None
        return str(err["code"]) if isinstance(err, dict) and "code" in err else None


def _from_httpx(resp: httpx.Response) -> Answer:
    return Answer(resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.content)


def _parse(data: bytes) -> Answer:
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return Answer(None, {}, data)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return Answer(int(parts[1]), headers, body)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep:
            return bytes(out)
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += rest[:size]
        data = rest[size + 2 :]


def _complete(data: bytes | bytearray) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        return body.endswith(b"0\r\n\r\n")
    for line in lowered.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def _body_parts(body: bytes, transport: Transport) -> tuple[list[bytes], str]:
    """The body as sent (pieces, chunk-framed when chunked) and its framing header."""
    size = transport.chunk_size or max(1, len(body))
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    if transport.content_length == "omit":
        framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p]
        return [*framed, b"0\r\n\r\n"], "transfer-encoding: chunked"
    declared = len(body) if transport.content_length == "exact" else transport.content_length
    return pieces, f"content-length: {declared}"


def send_raw(url: str, payload: Payload, key: str, timeout_s: float = 15.0) -> Answer:
    """One HTTP-layer payload over its own connection, byte for byte as the file describes it.

    A writer thread sends (pausing ``chunk_delay_s`` between pieces) while this thread reads:
    the guard answers as soon as it can judge (413 mid-body, 431 mid-head, 408 on a slow body)
    and closes, and the answer must be read before the writer's next write is reset.
    """
    host, port = url.removeprefix("http://").split(":")
    transport = payload.transport or Transport()
    pieces, framing = _body_parts(payload.body_bytes(), transport)
    lines = [f"{payload.method} {payload.endpoint} HTTP/1.1", f"host: {host}:{port}",
             f"authorization: Bearer {key}", "connection: close", framing]  # fmt: skip
    lines += [f"{name}: {value}" for name, value in payload.header_items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    delay = transport.chunk_delay_s or 0.0
    stop = threading.Event()
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)

    def write() -> None:
        try:
            for i, piece in enumerate([head, *pieces]):
                if i > 1 and delay and stop.wait(delay):
                    return
                for at in range(0, len(piece), 1 << 16):
                    if stop.is_set():
                        return
                    sock.sendall(piece[at : at + (1 << 16)])
        except OSError:
            pass  # the guard hung up: its answer, if any, is being read

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while not _complete(data) and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass  # reset after the answer: what was received stands
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        writer.join(5)
    return _parse(bytes(data))


def send(client: httpx.Client, payload: Payload, key: str = MAIN_KEY) -> Answer:
    headers = [*payload.header_items(), ("authorization", f"Bearer {key}")]
    resp = client.request(
        payload.method, payload.endpoint, content=payload.body_bytes(), headers=headers
    )
    return _from_httpx(resp)


# ------------------------------------------------------------------------------ the test


def _rss(server: RunningServer) -> int:
    return server.sampler.current_bytes()


def _describe(answers: Sequence[tuple[Payload, Answer]]) -> str:
    return "\n".join(
        f"  {p.id}: expected {p.expect.status} {p.expect.code}, got {a.status} {a.code} "
        f"{a.body[:160]!r}"
        for p, a in answers
    )


def _flood(client: httpx.Client, payload: Payload) -> list[Answer]:
    """Send a flood payload as a flood, under the key whose small limit it should hit."""
    code = payload.expect.code
    assert code in FLOOD_KEYS, f"{payload.id}: no flood key for {code}"
    key = FLOOD_KEYS[code]
    if code == "concurrency_limited":  # at once, one connection each: one holds the only slot

        def one(_: int) -> Answer:
            with httpx.Client(base_url=client.base_url, timeout=client.timeout) as own:
                return send(own, payload, key)

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(8)))
    return [send(client, payload, key) for _ in range(6)]  # in a row, faster than any refill


@pytest.mark.timeout(300)
def test_every_corpus_payload_through_the_guard_leaves_the_vulnerable_upstream_healthy(
    deployment: Deployment,
) -> None:
    upstream, guard = deployment.upstream, deployment.guard
    up_before = upstream.sampler.reset_peak()
    guard_before = _rss(guard)
    started = time.monotonic()
    answers: list[tuple[Payload, Answer]] = []
    unsupported_verdicts: dict[str, bool] = {}
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    with httpx.Client(base_url=guard.url, timeout=20.0, limits=limits) as client:
        for payload in SINGLE:
            if payload.layer == "http":
                answer = send_raw(guard.url, payload, MAIN_KEY)
            else:
                answer = send(client, payload)
            answers.append((payload, answer))
            if payload.kind == "benign" and payload.profiles.vulnerable == "unsupported":
                # The reference scheduler does not serve it: the guard must let it through
                # (its dry run says so) and relay the upstream's own refusal.
                verdict = client.post(
                    "/guard/v1/check",
                    params={"path": payload.endpoint},
                    content=payload.body_bytes(),
                    headers=[*payload.header_items(), ("authorization", f"Bearer {MAIN_KEY}")],
                )
                unsupported_verdicts[payload.id] = bool(verdict.json().get("allowed"))
        floods = {p.id: _flood(client, p) for p in FLOOD}
        health = httpx.get(upstream.url + "/health", timeout=5.0)
        ready = client.get("/readyz")
    elapsed = time.monotonic() - started
    up_peak = upstream.sampler.sample_now()
    up_after = _rss(upstream)
    guard_after = _rss(guard)

    everything = [a for _, a in answers] + [a for got in floods.values() for a in got]
    no_answer = [(p, a) for p, a in answers if a.status is None]
    assert not no_answer, "no HTTP answer:\n" + _describe(no_answer)
    server_errors = [(p, a) for p, a in answers if a.status is not None and a.status >= 500]
    assert not server_errors, "5xx from the guard:\n" + _describe(server_errors)
    assert all(a.status is not None and a.status < 500 for a in everything)

    wrong = [
        (p, a)
        for p, a in answers
        if p.kind == "attack" and not p.expect.matches(a.status or 0, a.code)
    ]
    assert not wrong, f"{len(wrong)} attacks got another answer:\n" + _describe(wrong)
    benign = [(p, a) for p, a in answers if p.kind == "benign"]
    served = [(p, a) for p, a in benign if p.profiles.vulnerable != "unsupported"]
    refused = [(p, a) for p, a in served if a.status != 200]
    assert not refused, "benign payloads refused:\n" + _describe(refused)
    assert unsupported_verdicts and all(unsupported_verdicts.values()), unsupported_verdicts

    for pid, got in floods.items():
        payload = next(p for p in FLOOD if p.id == pid)
        hit = [a for a in got if a.status == 429 and a.code == payload.expect.code]
        assert hit, f"{pid}: no 429 {payload.expect.code} in {[(a.status, a.code) for a in got]}"
        assert all(a.headers.get("retry-after", "").isdigit() for a in hit), pid
        assert all(a.status == 200 or a in hit for a in got), [(a.status, a.code) for a in got]
        assert got[0].status == 200 or payload.expect.code == "concurrency_limited"

    assert upstream.alive(), upstream.log_tail()
    assert health.status_code == 200 and ready.status_code == 200
    growth = max(up_peak, up_after) - up_before
    summary = (
        f"{len(SINGLE)} payloads + {sum(map(len, floods.values()))} flood requests in "
        f"{elapsed:.1f} s; upstream RSS {up_before / MiB:.0f} MB before, peak "
        f"{up_peak / MiB:.0f} MB, {up_after / MiB:.0f} MB after; guard RSS "
        f"{guard_before / MiB:.0f} -> {guard_after / MiB:.0f} MB; flood answers "
        + ", ".join(f"{k}: {[a.status for a in v]}" for k, v in floods.items())
    )
    print(summary)
    assert growth < MAX_UPSTREAM_GROWTH, summary
    assert guard.alive(), guard.log_tail()
