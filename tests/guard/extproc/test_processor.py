"""schedguard extproc spoken to directly over gRPC, as Envoy would, including as Envoy would
not: messages out of order, a stream cut after its headers; its health service and /readyz."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import httpx
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guard.extproc import SERVICE
from guard.gateway import Gateway, build_gateway
from guard.policy import default_policy, policy_from_yaml
from guard.telemetry import AccessLog
from tests._envoy import extproc_in_process
from tests._support import free_port

pytestmark = pytest.mark.timeout(120)


def _headers(pairs: Sequence[tuple[str, str]], end: bool = False) -> Any:
    headers = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]
    )
    return pb.HttpHeaders(headers=headers, end_of_stream=end)


REQUEST = [(":method", "POST"), (":path", "/v1/chat/completions"), (":authority", "x"),
           ("content-type", "application/json"), ("content-length", "60")]  # fmt: skip
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'


async def _exchange(port: int, messages: Sequence[Any]) -> tuple[list[Any], grpc.StatusCode]:
    """Send ``messages`` on one Process stream (each after the previous one's answer, as Envoy
    does), then close it; the answers and the stream's status."""
    answers: list[Any] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        try:
            for message in messages:
                await call.write(message)
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    break
                answers.append(answer)
            await call.done_writing()
            await call.code()
        except grpc.aio.AioRpcError:
            pass
        return answers, await call.code()


async def _idle(gateway: Gateway) -> None:
    for _ in range(200):
        if gateway.metrics.in_flight == 0 and gateway.concurrency.in_flight == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("a slot or an in-flight count leaked")


@pytest.fixture
async def processor() -> AsyncIterator[tuple[int, Gateway, int]]:
    policy = default_policy()
    gateway = build_gateway(policy, upstream=None)
    admin = free_port()
    async with extproc_in_process(policy, gateway=gateway, admin=admin) as port:
        yield port, gateway, admin


async def test_a_request_is_admitted_with_its_mutations() -> None:
    # The seed preset injects max_tokens into a request without one (the default adds
    # nothing: see the next test).
    policy = policy_from_yaml("preset: seed")
    gateway = build_gateway(policy, upstream=None)
    async with extproc_in_process(policy, gateway=gateway, admin=free_port()) as port:
        answers, code = await _exchange(
            port,
            [
                pb.ProcessingRequest(request_headers=_headers(REQUEST)),
                pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)),
            ],
        )
        await _idle(gateway)  # the stream ended before any answer: slot freed, recorded
    assert code == grpc.StatusCode.OK
    assert answers[0].WhichOneof("response") == "request_headers"
    common = answers[1].request_body.response
    assert b'"max_tokens":' in common.body_mutation.body
    sets = {h.header.key: h.header.raw_value for h in common.header_mutation.set_headers}
    assert int(sets["content-length"]) == len(common.body_mutation.body)


async def test_an_ordinary_request_goes_without_a_body_mutation(
    processor: tuple[int, Gateway, int],
) -> None:
    port, gateway, _ = processor
    answers, code = await _exchange(
        port,
        [
            pb.ProcessingRequest(request_headers=_headers(REQUEST)),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)),
        ],
    )
    assert code == grpc.StatusCode.OK
    common = answers[1].request_body.response
    assert not common.HasField("body_mutation")
    await _idle(gateway)


async def test_a_refusal_is_an_immediate_response_with_the_proxys_body(
    processor: tuple[int, Gateway, int],
) -> None:
    port, gateway, _ = processor
    body = b'{"model":"m","n":100000,"messages":[{"role":"user","content":"hi"}]}'
    answers, _ = await _exchange(
        port,
        [
            pb.ProcessingRequest(request_headers=_headers(REQUEST)),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        ],
    )
    immediate = answers[1].immediate_response
    assert immediate.status.code == 400 and b'"code":"n_exceeded"' in immediate.body
    await _idle(gateway)


async def test_a_refusals_access_line_has_the_bytes_sent_and_the_guards_time() -> None:
    policy = default_policy()
    stream = io.StringIO()
    gateway = build_gateway(policy, upstream=None, access_log=AccessLog(stream=stream))
    body = b'{"model":"m","n":100000,"messages":[{"role":"user","content":"hi"}]}'
    async with extproc_in_process(policy, gateway=gateway) as port:
        answers, _ = await _exchange(
            port,
            [
                pb.ProcessingRequest(request_headers=_headers(REQUEST)),
                pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
            ],
        )
        await _idle(gateway)
    gateway.access_log.flush()
    (line,) = (json.loads(text) for text in stream.getvalue().splitlines())
    sent = answers[1].immediate_response.body
    assert (line["status"], line["code"]) == (400, "n_exceeded")
    assert line["bytes_out"] == len(sent) > 0 and line["bytes_in"] == len(body)
    assert line["guard_ms"] > 0  # the checks ran: the guard's time is not 0


@pytest.mark.parametrize(
    "messages",
    [
        [pb.ProcessingRequest(response_body=pb.HttpBody(body=b"x", end_of_stream=True))],
        [pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))],
        [
            pb.ProcessingRequest(request_headers=_headers(REQUEST)),
            pb.ProcessingRequest(request_headers=_headers(REQUEST)),
        ],
        [pb.ProcessingRequest()],  # no message at all in the oneof
    ],
    ids=["response-first", "body-first", "headers-twice", "empty"],
)
async def test_a_malformed_stream_gets_an_error_status_and_leaks_nothing(
    processor: tuple[int, Gateway, int], messages: list[Any]
) -> None:
    port, gateway, _ = processor
    _, code = await _exchange(port, messages)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    await _idle(gateway)
    # and the processor still serves
    answers, code = await _exchange(port, [pb.ProcessingRequest(request_headers=_headers(REQUEST))])
    assert code == grpc.StatusCode.OK and answers


async def test_a_stream_cut_after_admission_frees_its_slot(
    processor: tuple[int, Gateway, int],
) -> None:
    port, gateway, _ = processor
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(pb.ProcessingRequest(request_headers=_headers(REQUEST)))
        await call.read()
        await call.write(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))
        )
        await call.read()
        assert gateway.concurrency.in_flight == 1  # admitted: it holds a slot
        call.cancel()  # Envoy gives up on it (the client left)
    await _idle(gateway)
    assert gateway.metrics.aborts[("client_gone",)] == 1


async def test_health_service_and_readyz(processor: tuple[int, Gateway, int]) -> None:
    port, _, admin = processor
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin}") as client:
        ready = await client.get("/readyz")
        metrics = await client.get("/metrics")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert metrics.status_code == 200 and "schedguard_guard_requests" in metrics.text


async def test_workers_serve_one_port_and_stop_on_sigterm(tmp_path: Any) -> None:
    """``schedguard extproc --workers 2``: both processes serve the port (SO_REUSEPORT); SIGTERM
    stops them all."""
    import signal
    import subprocess
    import sys

    from tests._support import live_descendants

    port = free_port()
    argv = [sys.executable, "-m", "schedguard", "extproc", "--port", str(port), "--workers", "2",
            "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        serving = False
        for _ in range(300):  # the workers' start-up (spawned interpreters)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    answer = await health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=SERVICE), timeout=1.0
                    )
                serving = answer.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.aio.AioRpcError:
                serving = False
            if serving and len(live_descendants()) >= 3:  # the parent and its two workers
                break
            await asyncio.sleep(0.1)
        assert serving
        for _ in range(4):  # new connections, spread by the kernel
            answers, code = await _exchange(
                port,
                [
                    pb.ProcessingRequest(request_headers=_headers(REQUEST)),
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)),
                ],
            )
            assert (
                code == grpc.StatusCode.OK and answers[1].WhichOneof("response") == "request_body"
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for _ in range(100):
        if not live_descendants():
            break
        await asyncio.sleep(0.05)
    assert not live_descendants()
