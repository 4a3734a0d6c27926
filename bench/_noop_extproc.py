"""The floor of the ext_proc path for bench/extproc.py: an ext_proc server that answers CONTINUE
to every message and does nothing else, as the aiohttp pass-through is the proxy's floor.

``python bench/_noop_extproc.py --port P [--sync] [--threads N]``: grpc.aio on uvloop (default),
or grpc's thread-pool server (``--sync``). Its health: the gRPC health service, ``SERVING``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

_ANSWERS = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "response_headers": pb.ProcessingResponse(response_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    "response_trailers": pb.ProcessingResponse(response_trailers=pb.TrailersResponse()),
}


class AioNoop(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            if not request.observability_mode:
                yield _ANSWERS[request.WhichOneof("request")]


class SyncNoop(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def Process(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        for request in requests:
            if not request.observability_mode:
                yield _ANSWERS[request.WhichOneof("request")]


async def _serve_aio(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(AioNoop(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


def _serve_sync(port: int, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    pb_grpc.add_ExternalProcessorServicer_to_server(SyncNoop(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    p.add_argument("--sync", action="store_true", help="grpc's thread-pool server, not grpc.aio")
    p.add_argument("--threads", type=int, default=64, help="--sync: worker threads")
    args = p.parse_args()
    if args.sync:
        _serve_sync(args.port, args.threads)
        return
    import uvloop

    uvloop.run(_serve_aio(args.port))


if __name__ == "__main__":
    main()
