"""Server-sent events in OpenAI's streaming format, with cleanup when the client goes away.

Each event is ``data: <json>\\n\\n``; the stream ends with ``data: [DONE]\\n\\n``. An error after
the response has started is sent as ``data: {"error": {...}}`` followed by ``[DONE]``, which the
OpenAI SDK raises as an APIError.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A streaming response that always closes its body iterator, and does so promptly.

    Starlette only notices a disconnect when a write fails (ASGI spec >= 2.4), so a stream that
    is waiting for its next token would hold its engine request (and KV blocks) until then. Here a
    disconnect is awaited alongside the stream and cancels it; then the body iterator is closed
    and ``on_close`` runs -- exactly once, whether the stream finished, failed, was cancelled, or
    never started (closing a generator that never started runs none of its code, so cleanup
    such as aborting engine requests belongs in ``on_close``).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        on_close: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            content=content,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._body = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    # OSError: the client went away mid-write; cleanup is below.
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    aclose = getattr(self._body, "aclose", None)
                    if aclose is not None:
                        await aclose()
            finally:
                if self._on_close is not None:
                    self._on_close()
