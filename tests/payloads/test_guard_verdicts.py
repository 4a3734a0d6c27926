"""Every corpus payload replayed through the guard's pipeline with the default policy.

Attacks must be refused with the status and code their file expects, benign look-alikes
allowed. Payloads run in a child process under RLIMIT_AS and a wall clock
(:func:`guard.isolation.run_limited`): all of them in one child, and, only if that child fails,
each in its own so the failure names the payload. ``layer: http`` payloads (headers, encodings,
chunking, timing, rate) cannot be judged from the body; the HTTP tests replay them, and here
they only have to load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guard.isolation import run_limited
from payloads import Payload, load_corpus, load_payload

MiB = 1 << 20
BATCH_TIMEOUT_S = 90.0
SINGLE_TIMEOUT_S = 20.0
MEM_LIMIT = 1024 * MiB
# Generous: a linear check of a body of a few MB takes milliseconds. This catches a check that
# went quadratic or started compiling something attacker-sized, not ordinary slowness.
MAX_SECONDS_PER_PAYLOAD = 2.0

CORPUS = load_corpus()
PIPELINE = [p for p in CORPUS if p.layer == "pipeline"]
HTTP = [p for p in CORPUS if p.layer == "http"]


@dataclass(frozen=True)
class Replay:
    id: str
    allowed: bool
    status: int
    code: str | None
    message: str | None
    seconds: float


def _replay(paths: list[str]) -> list[Replay]:
    """Child side: the default policy, one warm-up request, then every payload in order."""
    from guard.pipeline import evaluate_body
    from guard.policy import load_policy

    default = load_policy(None, env={})
    # Load the tokenizer and compile the scan patterns before anything is timed.
    evaluate_body(b'{"model":"m","prompt":"warm up"}', "/v1/completions", [], default)
    routed: dict[tuple[str, ...], Any] = {}
    out: list[Replay] = []
    for path in paths:
        payload = load_payload(Path(path))
        policy = default
        if payload.routes:  # the default policy, proxying the routes the payload needs
            routes = "[" + ", ".join(payload.routes) + "]"
            policy = routed.get(payload.routes) or load_policy(
                None, env={"SCHEDGUARD_ROUTES": routes}
            )
            routed[payload.routes] = policy
        raw = payload.body_bytes()
        headers = payload.header_items()
        start = time.perf_counter()
        verdict = evaluate_body(raw, payload.endpoint, headers, policy, method=payload.method)
        seconds = time.perf_counter() - start
        rejection = verdict.rejection
        message = None if rejection is None else rejection.message
        out.append(
            Replay(payload.id, verdict.allowed, verdict.status, verdict.code, message, seconds)
        )
    return out


@pytest.fixture(scope="module")
def replays() -> dict[str, Replay | str]:
    """Payload id -> its replay, or a description of how its child failed."""
    paths = [str(p.path) for p in PIPELINE]
    batch = run_limited(_replay, paths, mem_limit_bytes=MEM_LIMIT, timeout_s=BATCH_TIMEOUT_S)
    if batch.ok and batch.value is not None:
        return {r.id: r for r in batch.value}
    results: dict[str, Replay | str] = {}
    for payload in PIPELINE:  # attribute the failure to a payload
        one = run_limited(
            _replay, [str(payload.path)], mem_limit_bytes=MEM_LIMIT, timeout_s=SINGLE_TIMEOUT_S
        )
        if one.ok and one.value:
            results[payload.id] = one.value[0]
        else:
            results[payload.id] = (
                f"{one.outcome}: {one.error_type} {one.error_message} "
                f"(peak RSS {one.peak_rss_bytes // MiB} MiB, {one.wall_s:.1f} s)"
            )
    return results


@pytest.mark.parametrize("payload", PIPELINE, ids=[p.id for p in PIPELINE])
def test_pipeline_verdict(payload: Payload, replays: dict[str, Replay | str]) -> None:
    result = replays[payload.id]
    assert isinstance(result, Replay), f"{payload.id}: the guard did not answer: {result}"
    expect = payload.expect
    if payload.kind == "benign":
        assert result.allowed, (
            f"{payload.id} is benign but was refused: {result.status} {result.code}: "
            f"{result.message}"
        )
    else:
        assert not result.allowed, f"{payload.id} was allowed; expected {expect.code}"
        assert (result.status, result.code) == (expect.status, expect.code) or (
            expect.code is None and result.status == expect.status
        ), (
            f"{payload.id}: got {result.status} {result.code} ({result.message}); "
            f"expected {expect.status} {expect.code}"
        )
    assert result.seconds < MAX_SECONDS_PER_PAYLOAD, f"{payload.id} took {result.seconds:.2f} s"


@pytest.mark.parametrize("payload", HTTP, ids=[p.id for p in HTTP])
def test_http_layer_payload_loads(payload: Payload) -> None:
    if payload.kind == "benign":  # a look-alike of a framing attack
        assert payload.expect.status == 200
    else:
        assert payload.expect.status >= 400 and payload.expect.code
    assert payload.body_bytes() is not None
    assert payload.header_items()


def test_every_pipeline_payload_was_replayed(replays: dict[str, Replay | str]) -> None:
    assert set(replays) == {p.id for p in PIPELINE}
