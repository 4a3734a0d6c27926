"""The response-head cork of guard.http._protocol: held head, joined body, order kept."""

from __future__ import annotations

import asyncio
from typing import Any

from guard.http._protocol import _JOIN_MAX, _HeadCork


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, parts: Any) -> None:
        self.calls.append(("writelines", tuple(parts)))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", None))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


def cork() -> tuple[_HeadCork, RecordingTransport]:
    transport = RecordingTransport()
    return _HeadCork(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


async def test_head_and_body_leave_in_one_write_and_later_writes_pass_through() -> None:
    wrapped, transport = cork()
    wrapped.write(b"HEAD")
    assert transport.calls == []
    wrapped.write(b"BODY")
    wrapped.write(b"CHUNK")
    assert transport.calls == [("write", b"HEADBODY"), ("write", b"CHUNK")]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert transport.calls == [("write", b"HEADBODY"), ("write", b"CHUNK")]


async def test_a_lone_head_leaves_at_the_end_of_the_loop_iteration() -> None:
    wrapped, transport = cork()
    wrapped.write(b"HEAD")
    await asyncio.sleep(0)
    assert transport.calls == [("write", b"HEAD")]
    wrapped.write(b"LATER")
    assert transport.calls == [("write", b"HEAD"), ("write", b"LATER")]


async def test_a_large_body_is_not_copied() -> None:
    wrapped, transport = cork()
    body = b"x" * (_JOIN_MAX + 1)
    wrapped.write(b"HEAD")
    wrapped.write(body)
    assert transport.calls == [("writelines", (b"HEAD", body))]


async def test_close_sends_what_is_held_first() -> None:
    wrapped, transport = cork()
    wrapped.write(b"HEAD")
    wrapped.close()
    assert transport.calls == [("write", b"HEAD"), ("close", None)]
    assert wrapped.is_closing()
    await asyncio.sleep(0)
    assert len(transport.calls) == 2


async def test_nothing_is_written_to_a_closed_transport() -> None:
    wrapped, transport = cork()
    wrapped.write(b"HEAD")
    transport.closing = True
    await asyncio.sleep(0)
    assert transport.calls == []


async def test_other_attributes_reach_the_transport() -> None:
    wrapped, _ = cork()
    assert wrapped.get_extra_info("peername") == "extra:peername"
