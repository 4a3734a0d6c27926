"""Facts and helpers every test folder shares: where things are, and a free loopback port."""

from __future__ import annotations

import asyncio
import socket
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psutil

from guard.isolation import is_multiprocessing_helper

__all__ = [
    "REPO_ROOT",
    "TESTS_DIR",
    "FakeClock",
    "bytecodes",
    "free_port",
    "live_descendants",
    "peak_allocated",
]

T = TypeVar("T")

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


class FakeClock:
    """A clock the test moves by hand: ``clock()`` reads it, ``advance`` moves it on."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def until(condition: Callable[[], object], steps: int = 1000) -> None:
    """Step the event loop (``asyncio.sleep(0)``) until ``condition()`` holds; fail after
    ``steps`` steps rather than hang."""
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now. Racy in principle (released before the caller binds
    it); the servers the tests start report a taken port, so a collision fails loudly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def bytecodes(run: Callable[[], object]) -> int:
    """Python bytecodes executed by ``run()``: work counted the same on any machine at any
    load (what tests assert about cost instead of a wall clock)."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return count


def peak_allocated(run: Callable[[], T]) -> tuple[T, int]:
    """``run()``'s result and the most bytes Python had allocated at once while it ran, above
    what was allocated before (an expansion that was refused before it happened stays small)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = run()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return result, peak


def live_descendants() -> list[psutil.Process]:
    """This process's living children and their children (zombies and multiprocessing's own
    helpers left out): what a test that starts servers must have stopped."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not is_multiprocessing_helper(p):
                out.append(p)
        except psutil.Error:
            pass
    return out
