"""The guard's upstream side: the aiohttp client, the SSE relay, usage extraction, body splicing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from guard.answer import extract_usage, upstream_error_code
from guard.checks import Mutation
from guard.gateway import forward_body
from guard.http import Upstream, UpstreamConfig, UpstreamError, response_headers
from guard.http._sse_relay import DONE, SseRelay, error_event
from guard.pipeline import evaluate_body
from guard.policy import policy_from_yaml
from tests._guard_harness import fake_upstream
from tests._support import free_port

# ---------------------------------------------------------------------------------- SSE relay


def _chunk(index: int, text: str, finish: str | None = None, chat: bool = True) -> bytes:
    choice: dict[str, Any] = {"index": index, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    payload = {
        "id": "x1",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 7,
        "model": "m",
        "choices": [choice],
    }
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _events(data: bytes) -> list[Any]:
    out: list[Any] = []
    for block in data.split(b"\n\n"):
        if not block:
            continue
        assert block.startswith(b"data: ")
        payload = block[6:]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def _feed_all(relay: SseRelay, stream: bytes, step: int) -> bytes:
    out = b""
    for i in range(0, len(stream), step):
        out += relay.feed(stream[i : i + step])
        if relay.done:
            break
    return out + relay.finish()


def count_words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_relay_passes_a_stream_through_unchanged(step: int) -> None:
    stream = b"".join(_chunk(0, "a ", "stop" if i == 4 else None) for i in range(5)) + DONE
    relay = SseRelay(count_words, max_tokens=16)
    assert _feed_all(relay, stream, step) == stream
    assert relay.done and not relay.cut
    assert relay.tokens_out == relay.tokens_sent == 5
    assert relay.completion_tokens == 5


def test_relay_cuts_at_the_cap_with_a_final_chunk_and_done() -> None:
    stream = b"".join(_chunk(0, "tok ") for _ in range(10)) + DONE
    relay = SseRelay(count_words, max_tokens=3, include_usage=True, prompt_tokens=11)
    events = _events(_feed_all(relay, stream, 13))
    assert relay.cut and relay.done
    deltas = [e for e in events[:-1] if e["choices"] and e["choices"][0]["delta"]]
    assert len(deltas) == 3
    final = events[-3]
    assert final["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert final["id"] == "x1" and final["model"] == "m" and final["created"] == 7
    assert events[-2]["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert events[-1] == "[DONE]"


def test_relay_cut_of_a_completion_stream_uses_the_text_shape() -> None:
    stream = b"".join(_chunk(0, "x", chat=False) for _ in range(5))
    relay = SseRelay(count_words, max_tokens=2)
    events = _events(_feed_all(relay, stream, 1000))
    assert events[-2]["choices"][0] == {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": "length",
    }
    assert events[-1] == "[DONE]"


def test_relay_caps_each_choice_and_ends_when_all_are_done() -> None:
    stream = b"".join(_chunk(0, "a") + _chunk(1, "b") for _ in range(5)) + DONE
    relay = SseRelay(count_words, max_tokens=2, n=2)
    events = _events(_feed_all(relay, stream, 1000))
    finishes = [e["choices"][0] for e in events[:-1] if e["choices"][0].get("finish_reason")]
    assert [f["index"] for f in finishes] == [0, 1]
    assert events[-1] == "[DONE]"
    assert relay.cut


def test_relay_counts_tokens_with_the_counter_but_cuts_on_deltas() -> None:
    # A counter that sees 5 tokens per delta must not cut a legitimate 3-delta stream at 3.
    stream = b"".join(_chunk(0, "w w w w w", "stop" if i == 2 else None) for i in range(3)) + DONE
    relay = SseRelay(count_words, max_tokens=3)
    assert _feed_all(relay, stream, 50) == stream
    assert relay.tokens_out == 15 and not relay.cut


def test_relay_prefers_the_upstream_usage() -> None:
    usage = {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}
    stream = _chunk(0, "a") + b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
    stream += b"\n\n" + DONE
    relay = SseRelay(count_words, max_tokens=None)
    _feed_all(relay, stream, 3)
    assert relay.usage == usage and relay.completion_tokens == 9


def test_relay_accepts_crlf_split_anywhere() -> None:
    stream = b"".join(_chunk(0, "a") for _ in range(4)) + DONE
    crlf = stream.replace(b"\n", b"\r\n")
    relay = SseRelay(count_words, max_tokens=10)
    assert _feed_all(relay, crlf, 1) == stream
    assert relay.tokens_out == 4


def test_relay_passes_comments_and_unparsable_events() -> None:
    stream = b": keep-alive\n\n" + b"data: not json\n\n" + b"event: x\ndata: {}\n\n" + DONE
    relay = SseRelay(count_words, max_tokens=1)
    assert _feed_all(relay, stream, 4) == stream


def test_relay_refuses_an_oversized_event() -> None:
    relay = SseRelay(count_words, max_tokens=None, max_event_bytes=100)
    out = relay.feed(b"data: " + b"x" * 200)
    assert relay.done and relay.oversized
    events = _events(out)
    assert events[0]["error"]["code"] == "upstream_error" and events[-1] == "[DONE]"


def test_relay_drops_deltas_of_a_choice_it_ended() -> None:
    stream = _chunk(0, "a") + _chunk(0, "b") + _chunk(1, "c") + _chunk(0, "d") + _chunk(1, "e")
    relay = SseRelay(count_words, max_tokens=1, n=2)
    events = _events(_feed_all(relay, stream, 1000))
    texts = [
        (e["choices"][0]["index"], e["choices"][0]["delta"].get("content"))
        for e in events
        if e != "[DONE]"
    ]
    assert (0, "d") not in texts and (0, "a") in texts and (1, "c") in texts


def test_error_event_ends_with_done() -> None:
    err = UpstreamError("upstream_error", "boom")
    out = error_event(err.to_body())
    assert out.endswith(DONE) and b'"code":"upstream_error"' in out


# ------------------------------------------------------------------------------ usage, bodies


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"error": {"code": "model_not_found", "message": "m"}}', "model_not_found"),
        (b'{"error": {"code": 429}}', "429"),
        (b'{"error": {"code": "line\\nbreak"}}', None),  # not a printable token
        (b'{"error": {"code": "' + b"x" * 65 + b'"}}', None),  # too long for a log field
        (b'{"error": "flat"}', None),
        (b"[1, 2]", None),
        (b"not json", None),
        (b'{"error": {"code": "big"}, "pad": "' + b"p" * (70 << 10) + b'"}', None),
    ],
)
def test_upstream_error_code_is_a_short_printable_token_or_none(
    body: bytes, code: str | None
) -> None:
    assert upstream_error_code(body) == code


def test_extract_usage_finds_the_last_usage_object() -> None:
    body = {"choices": [{"text": 'say "usage": {"x": 1}'}], "usage": {"prompt_tokens": 3}}
    assert extract_usage(json.dumps(body).encode()) == {"prompt_tokens": 3}
    assert extract_usage(b'{"usage": null}') is None
    assert extract_usage(b"garbage") is None
    assert extract_usage(b'"usage": {"completion_tokens": 4, "details": {"a": 1}}}') == {
        "completion_tokens": 4,
        "details": {"a": 1},
    }


def _verdict(raw: bytes) -> Any:
    # The seed preset injects max_tokens when a request sets none (the default adds nothing).
    return evaluate_body(raw, "/v1/chat/completions", {}, policy_from_yaml("preset: seed"))


def test_forward_body_splices_an_injected_max_tokens() -> None:
    raw = b' {"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    verdict = _verdict(raw)
    assert verdict.allowed and verdict.mutations
    out = forward_body(verdict, raw)
    assert json.loads(out) == {**json.loads(raw), "max_tokens": 256}
    assert out.endswith(raw.strip()[1:])  # the rest is forwarded byte for byte


def test_forward_body_without_mutations_is_the_raw_body() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'
    verdict = _verdict(raw)
    assert not verdict.mutations
    assert forward_body(verdict, raw) is raw


def test_forward_body_falls_back_for_nested_mutations() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'
    verdict = _verdict(raw)
    nested = type(verdict)(
        True,
        None,
        verdict.costs,
        (Mutation(("messages", 0, "content"), "x", "t"),),
        {},
        verdict.view,
    )
    assert json.loads(forward_body(nested, raw))["messages"][0]["content"] == "x"


# ---------------------------------------------------------------------------------- upstream


async def test_upstream_maps_connection_refused_to_502() -> None:
    upstream = Upstream(UpstreamConfig(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2))
    try:
        with pytest.raises(UpstreamError) as exc:
            await upstream.send(
                "GET", "/v1/models", "", [], None, request_id="r", authorization=None
            )
        assert (exc.value.code, exc.value.status) == ("upstream_unavailable", 502)
        assert not await upstream.ready()
    finally:
        await upstream.aclose()


async def test_upstream_forwards_headers_and_pools_connections() -> None:
    async with fake_upstream() as fake:
        upstream = Upstream(UpstreamConfig(fake.url))
        try:
            headers = [
                (b"x-custom", b"1"),
                (b"connection", b"keep-alive"),
                (b"content-encoding", b"gzip"),
                (b"authorization", b"Bearer client"),
                (b"x-request-id", b"spoofed"),
            ]
            for _ in range(3):
                resp = await upstream.send(
                    "GET", "/v1/models", "a=1", headers, None, request_id="rid", authorization=None
                )
                assert resp.status == 200
                assert json.loads(await resp.read(1 << 20))["object"] == "list"
                resp.release()
                names = {k.lower(): v for k, v in response_headers(resp)}
                assert b"content-length" not in names and b"date" not in names
            got = {k.lower(): v for k, v in fake.received[-1].headers.items()}
            assert got["x-custom"] == "1" and got["x-request-id"] == "rid"
            assert got["accept-encoding"] == "identity"
            assert "authorization" not in got and "content-encoding" not in got
            assert await upstream.ready()
        finally:
            await upstream.aclose()


async def test_upstream_api_key_replaces_the_client_authorization() -> None:
    async with fake_upstream() as fake:
        upstream = Upstream(UpstreamConfig(fake.url), api_key="up-key")
        try:
            resp = await upstream.send(
                "GET", "/v1/models", "", [], None, request_id="r", authorization="Bearer c"
            )
            await resp.read(1 << 20)
            resp.release()
            assert fake.received[-1].headers["Authorization"] == "Bearer up-key"
        finally:
            await upstream.aclose()


async def test_upstream_read_caps_a_buffered_response() -> None:
    async with fake_upstream() as fake:
        upstream = Upstream(UpstreamConfig(fake.url))
        try:
            resp = await upstream.send(
                "POST",
                "/v1/completions",
                "",
                [(b"x-fake", b"big"), (b"x-fake-bytes", b"200000")],
                b"{}",
                request_id="r",
                authorization=None,
            )
            with pytest.raises(UpstreamError) as exc:
                await resp.read(10_000)
            assert exc.value.code == "upstream_response_too_large"
        finally:
            await upstream.aclose()


async def test_upstream_timeout_is_504() -> None:
    async with fake_upstream() as fake:
        upstream = Upstream(UpstreamConfig(fake.url, read_timeout_s=0.2))
        try:
            with pytest.raises(UpstreamError) as exc:
                await upstream.send(
                    "POST",
                    "/v1/completions",
                    "",
                    [(b"x-fake", b"hang")],
                    b"{}",
                    request_id="r",
                    authorization=None,
                )
            assert (exc.value.code, exc.value.status) == ("upstream_timeout", 504)
        finally:
            await upstream.aclose()


def test_upstream_config_is_validated() -> None:
    with pytest.raises(ValueError):
        UpstreamConfig("ftp://x")
    with pytest.raises(ValueError):
        UpstreamConfig("http://x", read_timeout_s=0)


async def test_readiness_falls_back_to_models_without_a_health_path() -> None:
    async with fake_upstream() as fake:
        upstream = Upstream(UpstreamConfig(fake.url), health_path="/no-such-health")
        try:
            assert await upstream.ready()
        finally:
            await upstream.aclose()


def test_a_body_read_whole_keeps_its_usage_when_it_ends() -> None:
    """A transport that hands the whole body then says it ended (Envoy's last body message)
    settles with the body's usage, not with an empty tail's."""
    from guard.answer import Answer
    from guard.exchange import Exchange
    from guard.telemetry import GuardMetrics

    ex = Exchange(method="POST", route="/v1/completions", path="/v1/completions", start=0.0)
    answer = Answer(ex, GuardMetrics(), len, {})
    answer.start(200, False)
    answer.whole(b'{"usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}}')
    assert answer.ended() == b""
    assert answer.settlement(reserved=500) == 10 and ex.completion_tokens == 6
