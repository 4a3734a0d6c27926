"""Make a MemoryError end the server, as the OOM killer ends a real one.

Under ``RLIMIT_AS`` Python raises ``MemoryError`` where a machine without the cap would have had
the process killed (the seed's failure). Left alone, the app answers 500 ``out_of_memory`` and
carries on in an unknown state; ``schedguard ref`` exits with 137 (128 + SIGKILL) instead, so the
cap behaves like the machine's memory running out and the demo reports ``killed``.
"""

from __future__ import annotations

import os
from typing import NoReturn

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

OOM_EXIT_CODE = 137


def _die() -> NoReturn:
    # No logging machinery: it may need memory we no longer have.
    os.write(2, b"schedguard: MemoryError under the memory cap; exiting (137)\n")
    os._exit(OOM_EXIT_CODE)


class ExitOnMemoryError:
    """Pure ASGI middleware: a ``MemoryError`` escaping the app exits the process at once."""

    def __init__(self, app: ASGIApp, /) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except MemoryError:
            _die()


async def _exit_handler(_: Request, __: Exception) -> NoReturn:
    _die()


def exit_on_memory_error(app: Starlette) -> None:
    """Replace the app's MemoryError handling (a 500) with process exit, wherever it is raised:
    in an endpoint (the exception handler) or in a middleware (the ASGI wrapper, which sits
    inside Starlette's outermost error middleware)."""
    app.add_exception_handler(MemoryError, _exit_handler)
    app.add_middleware(ExitOnMemoryError)
