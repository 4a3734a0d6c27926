"""The reference scheduler's own exceptions. Its refusals are :class:`guard.errors.GuardError`
(shared with the guard, so both answer with the same codes); these add what only a server has."""

from __future__ import annotations

from guard.errors import GuardError

__all__ = ["ClientGone", "ServerError"]


class ServerError(GuardError):
    """The server failed (500): a bug (``internal_error``) or an address-space cap reached
    (``out_of_memory``); the cause is logged, not sent."""

    status = 500
    type = "server_error"


class ClientGone(GuardError):
    """The client disconnected before the answer was ready. Never seen by the client (it has
    left); counted under its code."""

    status = 499
