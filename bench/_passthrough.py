"""The baseline of bench/gateway.py: a minimal pass-through proxy, with the guard's HTTP stack.

``python bench/_passthrough.py --upstream URL --port P`` runs a raw ASGI app on uvicorn with the
guard's server settings (uvloop, httptools, no access log) that forwards every request to the
upstream with one pooled ``aiohttp.ClientSession`` configured like the guard's
(:mod:`guard.http._upstream`: same connection limit, keep-alive, no decompression, no cookie jar) and
relays the answer: read whole when it has a Content-Length, chunk by chunk otherwise (SSE).
No checks, no header filtering beyond the framing headers, no logging, no metrics: what any
proxy must do, so the guard's ratio to it is the cost of guarding.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import aiohttp
import uvicorn

__all__ = ["PassThrough", "main"]

# Recomputed by the client library or the server, or meaningless across a hop.
_SKIP_REQUEST = frozenset(
    {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"expect"}
)
_SKIP_RESPONSE = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding"})


class PassThrough:
    """A raw ASGI app forwarding every HTTP request to ``upstream``."""

    def __init__(self, upstream: str, max_connections: int = 256) -> None:
        self.base = upstream.rstrip("/")
        self.max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=4.0),
                timeout=aiohttp.ClientTimeout(total=600, connect=5, sock_read=60),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self.session

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self.session is not None:
                        await self.session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        parts: list[bytes] = []
        more = True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(parts)
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k not in _SKIP_REQUEST
        }
        query = scope.get("query_string", b"")
        url = self.base + scope["path"] + ("?" + query.decode("latin-1") if query else "")
        try:
            resp = await self._session().request(
                scope["method"], url, data=body or None, headers=headers, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError, OSError):
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            out = [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in resp.headers.items()
                if k.lower() not in _SKIP_RESPONSE
            ]
            if resp.content_length is not None:
                data = await resp.read()
                out.append((b"content-length", str(len(data)).encode()))
                await send({"type": "http.response.start", "status": resp.status, "headers": out})
                await send({"type": "http.response.body", "body": data})
                return
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="base URL of the upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(
        PassThrough(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=5,
        server_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
