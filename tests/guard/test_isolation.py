"""guard.isolation: limits hold, outcomes map, nothing is left running."""

from __future__ import annotations

import os
import sys
import time

import pytest

from guard.errors import LimitExceeded
from guard.isolation import (
    IsolatedResult,
    PeakRssSampler,
    run_limited,
    spawn_limited_server,
    stop_server,
)
from tests._support import live_descendants

MiB = 1 << 20


# Child-side functions: top level so they pickle by reference.
def add(a: int, b: int, *, c: int = 0) -> int:
    return a + b + c


def raise_guard() -> None:
    raise LimitExceeded("template_depth_exceeded", "depth 9 > 8")


def raise_value() -> None:
    raise ValueError("bad input")


def hog_memory() -> int:
    chunks = []
    while True:
        chunks.append(bytearray(16 * MiB))  # bytearray touches its pages: RSS grows too


def allocate(n: int) -> int:
    block = bytearray(n)
    return len(block)


def spin() -> None:
    while True:
        pass


def sleep_with_grandchild() -> None:
    import subprocess

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(60)


def return_unpicklable() -> object:
    return lambda: None


def return_huge() -> bytes:
    from guard import isolation

    return b"x" * (isolation.MAX_RESULT_BYTES + 1)


def die_by_signal() -> None:
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def exit_hard() -> None:
    os._exit(3)


def rlimit_as() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)[0]


@pytest.fixture(autouse=True)
def _nothing_left_running() -> object:
    before = {p.pid for p in live_descendants()}
    yield
    deadline = time.monotonic() + 2.0
    left = [p for p in live_descendants() if p.pid not in before]
    while left and time.monotonic() < deadline:  # reaping is asynchronous in the forkserver
        time.sleep(0.02)
        left = [p for p in live_descendants() if p.pid not in before]
    assert left == []


def test_ok_value_and_kwargs() -> None:
    r = run_limited(add, 1, 2, c=3, timeout_s=5)
    assert isinstance(r, IsolatedResult)
    assert (r.outcome, r.value, r.error_type, r.error_code) == ("ok", 6, None, None)
    assert r.ok
    assert 0 < r.peak_rss_bytes < 512 * MiB


def test_rlimit_is_set_in_child_only() -> None:
    r = run_limited(rlimit_as, mem_limit_bytes=300 * MiB, timeout_s=5)
    assert r.value == 300 * MiB
    assert rlimit_as() != 300 * MiB


def test_guard_error_code_is_mapped() -> None:
    r = run_limited(raise_guard, timeout_s=5)
    assert r.outcome == "error"
    assert r.error_type == "LimitExceeded"
    assert r.error_code == "template_depth_exceeded"
    assert r.error_message == "depth 9 > 8"


def test_plain_exception_has_no_code() -> None:
    r = run_limited(raise_value, timeout_s=5)
    assert (r.outcome, r.error_type, r.error_code, r.error_message) == (
        "error",
        "ValueError",
        None,
        "bad input",
    )


def test_memory_hog_is_killed_within_cap() -> None:
    cap = 256 * MiB
    r = run_limited(hog_memory, mem_limit_bytes=cap, timeout_s=10)
    assert r.outcome == "killed"
    assert r.error_type == "MemoryError"
    assert 100 * MiB < r.peak_rss_bytes <= cap


def test_allocation_under_cap_succeeds() -> None:
    r = run_limited(allocate, 64 * MiB, mem_limit_bytes=512 * MiB, timeout_s=5)
    assert r.value == 64 * MiB
    assert r.peak_rss_bytes >= 64 * MiB


def test_infinite_loop_times_out() -> None:
    r = run_limited(spin, timeout_s=0.5)
    assert r.outcome == "timeout"
    assert r.wall_s >= 0.5  # it ran until the timeout, then was killed
    assert r.value is None


def test_timeout_kills_grandchildren() -> None:
    r = run_limited(sleep_with_grandchild, timeout_s=0.8)
    assert r.outcome == "timeout"


def test_unpicklable_result_does_not_hang() -> None:
    r = run_limited(return_unpicklable, timeout_s=5)
    assert (r.outcome, r.error_type) == ("error", "ResultError")


def test_oversized_result_is_refused() -> None:
    r = run_limited(return_huge, mem_limit_bytes=1 << 30, timeout_s=10)
    assert (r.outcome, r.error_type) == ("error", "ResultError")
    assert "limit" in (r.error_message or "")


def test_death_by_signal_is_killed() -> None:
    r = run_limited(die_by_signal, timeout_s=5)
    assert (r.outcome, r.error_type) == ("killed", "SIGSEGV")


def test_exit_without_result_is_error() -> None:
    r = run_limited(exit_hard, timeout_s=5)
    assert (r.outcome, r.error_type) == ("error", "ExitCode")


def test_unpicklable_function_raises_in_parent() -> None:
    with pytest.raises((AttributeError, TypeError, Exception)):
        run_limited(lambda: 1, timeout_s=1)  # type: ignore[arg-type,return-value]


def test_limited_server_runs_under_cap_and_stops() -> None:
    code = "import resource, time; print(resource.getrlimit(resource.RLIMIT_AS)[0], flush=True); time.sleep(60)"
    import subprocess

    proc = spawn_limited_server(
        [sys.executable, "-c", code], mem_limit_bytes=200 * MiB, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) == 200 * MiB
        assert os.getpgid(proc.pid) == proc.pid
        with PeakRssSampler(proc.pid, 0.01) as sampler:
            peak = sampler.sample_now()
        assert 1 * MiB < peak < 200 * MiB
    finally:
        stop_server(proc, grace_s=1.0)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode is not None


def test_many_calls_are_cheap() -> None:
    run_limited(add, 0, 0)  # the first call may start the forkserver
    start = time.perf_counter()
    for i in range(5):
        assert run_limited(add, i, 1).value == i + 1
    per_call = (time.perf_counter() - start) / 5
    assert per_call < 0.5


def test_sampler_reset_starts_a_new_window() -> None:
    import subprocess

    code = (
        "import sys; b = bytearray(96 << 20); del b; print('freed', flush=True); "
        "sys.stdin.readline()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == b"freed\n"
        sampler = PeakRssSampler(proc.pid, 0.01)
        assert sampler.sample_now() >= 96 * MiB  # VmHWM remembers the freed block
        baseline = sampler.reset_peak()
        assert baseline < 64 * MiB
        assert sampler.sample_now() < 64 * MiB
        proc.stdin.write(b"\n")
        proc.stdin.flush()
    finally:
        stop_server(proc, grace_s=1.0)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()
