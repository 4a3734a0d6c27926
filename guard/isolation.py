"""Run code that may exhaust memory or time in a child process with hard limits.

:func:`run_limited` runs one call in a child: the tests and the bench scripts use it. The child
gets ``RLIMIT_AS`` (address space) before anything attacker-sized is unpickled, the parent
enforces the wall clock and kills the child's whole process group, and the peak RSS is reported
whether the child survives or not. :func:`spawn_limited_server` starts a long-running server
under ``RLIMIT_AS`` and :class:`PeakRssSampler` follows its peak RSS: the demo, the load tests
and ``bench/gateway.py`` use those. The fuzz oracles do not use this module: they run inputs in
batches in their own limited workers, forked from a warm zygote (``fuzz/_worker.py``).

Children come from the ``forkserver`` context: a fork per call (~8 ms) without inheriting the
caller's threads, locks or address space (a forked pytest process could already be over the cap).
The forkserver and multiprocessing's resource tracker stay alive as helpers of the caller;
:func:`is_multiprocessing_helper` recognises them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Generic, Literal, TypeVar

import psutil

from guard.errors import GuardError

__all__ = [
    "ChildOutcome",
    "IsolatedResult",
    "PeakRssSampler",
    "is_multiprocessing_helper",
    "kill_tree",
    "preload",
    "run_limited",
    "spawn_limited_server",
    "stop_server",
]

T = TypeVar("T")
ChildOutcome = Literal["ok", "error", "killed", "timeout"]

# Results bigger than this are refused in the child (a reply must not cost the parent memory).
MAX_RESULT_BYTES = 64 << 20
_SAMPLE_INTERVAL_S = 0.01
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class IsolatedResult(Generic[T]):
    """What happened to one isolated call.

    ``killed`` means the memory cap was reached (``MemoryError``, ``error_type="MemoryError"``) or
    the child died by a signal (``error_type`` is the signal name); ``timeout`` means the parent
    killed it at the wall-clock limit.
    """

    outcome: ChildOutcome
    value: T | None
    error_type: str | None
    error_code: str | None
    error_message: str | None
    wall_s: float
    peak_rss_bytes: int

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


# ---------------------------------------------------------------------------- child side


def _set_address_space_limit(mem_limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem_limit_bytes, mem_limit_bytes))


def _die_with_parent() -> None:
    # If the forkserver (and so the caller) dies, take the child with it instead of orphaning a
    # possibly endless loop.
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _maxrss_bytes() -> int:
    # ru_maxrss is in KiB on Linux and bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _child_main(conn: multiprocessing.connection.Connection, payload: bytes, mem: int) -> None:
    """Entry point of the child: limit, run, reply with one pickled tuple, exit."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # own group, so the parent can kill everything fn starts
    _die_with_parent()
    _set_address_space_limit(mem)

    outcome: ChildOutcome = "ok"
    value: Any = None
    error_type: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    try:
        fn, args, kwargs = pickle.loads(payload)
        del payload
        value = fn(*args, **kwargs)
    except MemoryError as exc:
        outcome, error_type, error_message = "killed", "MemoryError", str(exc) or "memory cap"
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are results too
        outcome, error_type = "error", type(exc).__name__
        error_message = str(exc)[:4096]
        if isinstance(exc, GuardError):
            error_code = exc.code
    # The exception (and the frames holding the big allocations) is released here.

    try:
        data = pickle.dumps(
            (outcome, value, error_type, error_code, error_message, _maxrss_bytes()),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        if len(data) > MAX_RESULT_BYTES:
            raise ValueError(f"result is {len(data)} bytes pickled; limit {MAX_RESULT_BYTES}")
    except MemoryError:
        value = None
        data = pickle.dumps(
            ("killed", None, "MemoryError", None, "memory cap while pickling result", 0)
        )
    except BaseException as exc:
        value = None
        data = pickle.dumps(
            ("error", None, "ResultError", None, f"{type(exc).__name__}: {exc}"[:4096], 0)
        )
    try:
        conn.send_bytes(data)
    finally:
        conn.close()


# --------------------------------------------------------------------------- parent side


_PRELOAD = ["__main__", "guard.errors", "guard.isolation"]


def preload(*modules: str) -> None:
    """Import ``modules`` once in the forkserver instead of in every child.

    A child otherwise imports the module of ``fn`` on each call (tens of ms for a module that
    imports FastAPI or pytest, against ~8 ms for the fork itself). Only takes effect if called
    before the first :func:`run_limited` of the process starts the forkserver.
    """
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # Preloaded in the server, so a call costs a fork, not an interpreter start.
        ctx.set_forkserver_preload(list(_PRELOAD))
        return ctx
    return multiprocessing.get_context("spawn")


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group (if it leads one) and all its descendants."""
    try:
        proc = psutil.Process(pid)
        descendants = proc.children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    for p in [*descendants]:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def run_limited(
    fn: Callable[..., T],
    *args: Any,
    mem_limit_bytes: int = 1 << 30,
    timeout_s: float = 10.0,
    **kwargs: Any,
) -> IsolatedResult[T]:
    """Call ``fn(*args, **kwargs)`` in a fresh child under ``RLIMIT_AS`` and a wall clock.

    ``fn`` must be a picklable top-level function; its arguments and result must pickle. Never
    raises for what happens in the child; raises ``pickle.PicklingError``/``TypeError``/
    ``AttributeError`` at once if ``fn`` or its arguments cannot be sent.
    """
    payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    ctx = _context()
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(  # type: ignore[attr-defined]
        target=_child_main, args=(writer, payload, mem_limit_bytes), daemon=True
    )
    start = time.perf_counter()
    proc.start()
    writer.close()
    sampler = PeakRssSampler(proc.pid, _SAMPLE_INTERVAL_S, include_children=False)
    sampler.start()
    try:
        reply, timed_out = _await_reply(reader, proc, start + timeout_s)
    finally:
        sampler.sample_now()
        exitcode = _reap(proc)
        sampler.stop()
        reader.close()
    wall_s = time.perf_counter() - start
    peak = sampler.peak_bytes
    if reply is not None:
        outcome, value, error_type, error_code, error_message, child_peak = reply
        return IsolatedResult(
            outcome, value, error_type, error_code, error_message, wall_s, max(peak, child_peak)
        )
    if timed_out:
        return IsolatedResult(
            "timeout", None, None, None, f"exceeded {timeout_s:g} s wall clock", wall_s, peak
        )
    code = exitcode if exitcode is not None else 0
    if code < 0:
        name = _signal_name(code)
        return IsolatedResult("killed", None, name, None, f"child died by {name}", wall_s, peak)
    return IsolatedResult(
        "error", None, "ExitCode", None, f"child exited {code} without a result", wall_s, peak
    )


def _await_reply(
    reader: multiprocessing.connection.Connection, proc: BaseProcess, deadline: float
) -> tuple[tuple[Any, ...] | None, bool]:
    """The child's reply (None if it sent none) and whether the wall clock ran out first."""
    pid = _pid(proc)
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return None, True
        ready = multiprocessing.connection.wait([reader, proc.sentinel], timeout=remaining)
        if reader in ready:
            reply = _receive(reader, pid, deadline)
            return reply, reply is None and time.perf_counter() >= deadline
        if proc.sentinel in ready:
            # Died without writing; a reply may still be buffered in the pipe.
            return (_receive(reader, pid, deadline) if reader.poll(0) else None), False


def _pid(proc: BaseProcess) -> int:
    pid = proc.pid
    assert pid is not None  # started
    return pid


def _reap(proc: BaseProcess) -> int | None:
    """Kill what is left of the child (and anything it started in its group); its exit code."""
    pid = _pid(proc)
    if proc.exitcode is None:
        kill_tree(pid)
    else:
        # The child is gone; anything it started in its group goes too.
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    proc.join(timeout=5.0)
    if proc.exitcode is None:  # pragma: no cover - join after SIGKILL should not time out
        kill_tree(pid)
        proc.join()
    exitcode: int | None = proc.exitcode
    with contextlib.suppress(ValueError):
        proc.close()
    return exitcode


def _receive(
    reader: multiprocessing.connection.Connection, pid: int, deadline: float
) -> tuple[Any, ...] | None:
    # recv_bytes blocks until the whole message is in; a watchdog kills the child at the deadline
    # so a stalled writer ends in EOF instead of a hang.
    watchdog = threading.Timer(max(0.0, deadline - time.perf_counter()), kill_tree, (pid,))
    watchdog.daemon = True
    watchdog.start()
    try:
        data = reader.recv_bytes(MAX_RESULT_BYTES + (1 << 16))
    except (EOFError, OSError):
        return None
    finally:
        watchdog.cancel()
    try:
        reply = pickle.loads(data)
    except Exception as exc:  # e.g. the value's class cannot be imported here
        return ("error", None, "ResultError", None, f"cannot unpickle result: {exc!r}", 0)
    if not isinstance(reply, tuple) or len(reply) != 6:
        return ("error", None, "ResultError", None, "malformed reply from child", 0)
    return reply


def is_multiprocessing_helper(proc: psutil.Process) -> bool:
    """True for the forkserver and resource tracker that outlive calls by design."""
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing.forkserver" in cmd or "multiprocessing.resource_tracker" in cmd


# ------------------------------------------------------------------------------ servers


def spawn_limited_server(
    argv: Sequence[str],
    *,
    mem_limit_bytes: int,
    env: Mapping[str, str] | None = None,
    stdout: int | None = subprocess.DEVNULL,
    stderr: int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as a long-running child in its own process group under ``RLIMIT_AS``.

    The limit is set by a tiny exec wrapper (``python -m guard._limited_exec``) rather than
    ``preexec_fn``, which is unsafe when the caller has threads. Stop it with :func:`stop_server`.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    wrapped = [sys.executable, "-m", "guard._limited_exec", str(mem_limit_bytes), "--", *argv]
    return subprocess.Popen(
        wrapped,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        process_group=0,
    )


def stop_server(proc: subprocess.Popen[Any], grace_s: float = 3.0) -> int | None:
    """SIGTERM the server's group, wait ``grace_s``, then SIGKILL the whole tree; reap it."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    kill_tree(proc.pid)  # stray grandchildren too, even if the leader has exited
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    return proc.returncode


# --------------------------------------------------------------------------- RSS sampler


def _hwm_bytes(pid: int) -> int:
    """The kernel's own RSS high-water mark (VmHWM), so peaks between samples are not missed."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakRssSampler:
    """Samples the RSS of ``pid`` (plus its descendants) on a daemon thread; keeps the peak.

    The process's own VmHWM is read too, so the peak of the process itself is exact up to the last
    sample even when spikes are shorter than the interval. Usable as a context manager.
    """

    def __init__(
        self, pid: int, interval_s: float = 0.05, *, include_children: bool = True
    ) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.include_children = include_children
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._proc = None

    @property
    def peak_bytes(self) -> int:
        with self._lock:
            return self._peak

    def current_bytes(self) -> int:
        """RSS now: the process plus (if asked) its descendants; 0 once it is gone."""
        if self._proc is None:
            return 0
        try:
            total: int = self._proc.memory_info().rss
            if self.include_children:
                for child in self._proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        total += child.memory_info().rss
        except psutil.Error:
            return 0
        return total

    def sample_now(self) -> int:
        """Take one sample immediately; return the peak so far."""
        total = self.current_bytes()
        hwm = _hwm_bytes(self.pid)
        with self._lock:
            self._peak = max(self._peak, total, hwm)
            return self._peak

    def reset_peak(self) -> int:
        """Start a new measurement window; return the current RSS (the window's baseline).

        Also resets the kernel's VmHWM of the process (``clear_refs`` 5, Linux >= 4.0), so the
        peak of the next window is not hidden by an earlier, higher one.
        """
        with contextlib.suppress(OSError), open(f"/proc/{self.pid}/clear_refs", "wb") as f:
            f.write(b"5")
        with self._lock:
            self._peak = 0
        current = self.current_bytes()
        self.sample_now()
        return current

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_now()
            self._stop.wait(self.interval_s)

    def start(self) -> PeakRssSampler:
        if self._thread is None:
            self.sample_now()
            self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak_bytes

    def __enter__(self) -> PeakRssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
