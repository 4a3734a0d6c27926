"""Stop strings over streamed text: find the first one, never emit part of one."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feeds text deltas; returns what may be emitted and whether a stop string was reached.

    Holds back the last ``len(longest stop) - 1`` characters, which might be the start of a stop
    string completed by the next delta, so each call scans only the held text plus the delta.
    """

    __slots__ = ("_held", "_hold", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""

    def __bool__(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, bool]:
        buf = self._held + text
        first = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if first >= 0:
            self._held = ""
            return buf[:first], True
        cut = max(0, len(buf) - self._hold)
        self._held = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
