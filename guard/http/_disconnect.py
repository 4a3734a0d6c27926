"""The server telling the app that a request's client is gone, without a task per request.

ASGI reports a disconnect only through ``receive()``, so an app that must stop work the moment
the client leaves keeps a task waiting on ``receive()`` for every request: a task created,
scheduled and cancelled per request, measured at a few percent of the guard's own time per
request. The guard's uvicorn protocol (:mod:`guard.http._protocol`) puts a
:class:`DisconnectHook` in each request's ``scope["extensions"]`` under
:data:`DISCONNECT_EXTENSION` and fires it when the connection is lost before the response is
complete; the gateway uses the hook when it is there and the watcher task otherwise (other ASGI
servers, the test transports).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["DISCONNECT_EXTENSION", "DisconnectHook"]

DISCONNECT_EXTENSION = "schedguard.disconnect"


class DisconnectHook:
    """Set :attr:`callback` to be called (once) when the client's connection is lost."""

    __slots__ = ("callback", "lost")

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None
        self.lost = False

    def fire(self) -> None:
        """The connection is gone: remember it and call the callback, if one is set."""
        self.lost = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()
