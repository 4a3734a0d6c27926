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

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from loadtests.upstream_corpus import corpus_routes
from payloads.loader import Payload, load_corpus
from schedguard.demo import ref_server
from schedguard.servers import RunningServer
from tests._corpus_client import FLOOD_KEYS, MAIN_KEY, Answer, corpus_policy, send, send_raw
from tests._guard_process import guard_spec, start

MiB = 1 << 20
MAX_UPSTREAM_GROWTH = 48 * MiB  # "a few tens of MB": allocator arenas, caches; not the payloads

POLICY = corpus_policy(1.0, "upstream: {read_timeout_s: 15, total_timeout_s: 20}")

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
                answer = send(client, payload, MAIN_KEY)
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
