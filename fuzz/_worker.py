"""The oracle's processes: one execution probe, a zygote that forks limited workers, the worker.

Layout (``isolate=True``)::

    oracle (caller) --control socket--> zygote (imports and warms up the target once)
          |                                 | fork per (re)start, ~ms
          +------------data socket------> worker (RLIMIT_AS, soft CPU timer, serves batches)

The zygote exists so that a worker killed by a timeout or a memory cap is replaced by a fork of
an already warm process instead of a fresh interpreter (imports, BPE ranks: seconds). The caller
talks to the worker directly over a socket pair whose end the zygote hands over (SCM_RIGHTS);
the zygote only forks and reaps. Every process dies with its parent (PR_SET_PDEATHSIG).

Wire format: caller -> worker ``u32 count`` then ``u32 len + bytes`` per input; worker -> caller
one ``u32 len + pickle(RawResult)`` frame per input, written as soon as that input is done, so
the caller knows which input a hang belongs to.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import resource
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from dataclasses import astuple, dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from fuzz._exceptions import SoftTimeout

if TYPE_CHECKING:
    from fuzz.targets import FuzzTarget

__all__ = [
    "ExecStatus",
    "MemProbe",
    "RawResult",
    "execute_one",
    "freeze_heap",
    "on_timer",
]

_U32 = struct.Struct("!I")
_PID = struct.Struct("!ii")
_PR_SET_PDEATHSIG = 1
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class ExecStatus:
    OK = 0
    REJECTED = 1  # one of the target's documented rejections
    EXCEPTION = 2  # anything else: a crash
    MEMORY = 3  # MemoryError (RLIMIT_AS reached)
    SOFT_TIMEOUT = 4  # the CPU timer fired inside the target


@dataclass(frozen=True, slots=True)
class RawResult:
    """What the probe measured; the oracle classifies it against the budgets."""

    status: int
    wall_s: float
    cpu_s: float
    mem_bytes: int
    steps: int
    output_tokens: int
    error_type: str | None = None
    error_message: str | None = None
    where: str | None = None
    error_code: str | None = None
    # The worker's CPU seconds so far (all inputs): the caller's kill decision compares it
    # with /proc/<pid>/stat to tell a CPU-bound hang from a worker starved by other load.
    cpu_total: float = 0.0


def on_timer(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeout


class MemProbe:
    """Peak RSS growth of one execution, from the kernel's high-water mark.

    Writing ``5`` to ``/proc/self/clear_refs`` resets VmHWM to the current RSS (Linux >= 4.0),
    so ``VmHWM after - VmRSS before`` is the input's own peak; ~15 µs with the files kept open.
    Without procfs it falls back to ``ru_maxrss`` deltas (only new all-time peaks show).
    """

    def __init__(self) -> None:
        self._status = self._clear = self._statm = -1
        try:
            self._status = os.open("/proc/self/status", os.O_RDONLY)
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY)
        except OSError:
            self.close()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._base = 0

    def start(self) -> None:
        if self._clear >= 0:
            try:
                os.write(self._clear, b"5")
                self._base = int(os.pread(self._statm, 128, 0).split()[1]) * self._page
                return
            except OSError:
                self.close()
        self._base = _maxrss()

    def peak_growth(self) -> int:
        if self._clear >= 0:
            try:
                text = os.pread(self._status, 4096, 0)
                i = text.find(b"VmHWM:")
                hwm = int(text[i + 6 : text.find(b"kB", i)]) * 1024
                return max(0, hwm - self._base)
            except (OSError, ValueError):
                return 0
        return max(0, _maxrss() - self._base)

    def vm_size(self) -> int:
        try:
            fd = os.open("/proc/self/statm", os.O_RDONLY)
            try:
                return int(os.read(fd, 128).split()[0]) * self._page
            finally:
                os.close(fd)
        except (OSError, ValueError, IndexError):
            return 0

    def close(self) -> None:
        for fd in (self._status, self._statm, self._clear):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._status = self._statm = self._clear = -1


def freeze_heap() -> None:
    """Move everything alive now (modules, BPE ranks) out of the collector's sight: a full
    collection then scans only what inputs allocate, so its pause is not charged to an input
    as tens of milliseconds (and forked workers do not touch the shared pages)."""
    gc.collect()
    gc.freeze()


def _maxrss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _where(tb: TracebackType | None) -> str | None:
    """The innermost frame, project-relative when it is ours: the crash's dedup key."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return None
    frame = frames[-1]
    path = frame.filename
    if path.startswith(_PROJECT_ROOT):
        path = path[len(_PROJECT_ROOT) + 1 :]
    else:
        path = "/".join(Path(path).parts[-2:])
    return f"{path}:{frame.lineno}:{frame.name}"


def _progress(target: FuzzTarget) -> tuple[int, int]:
    fn = getattr(target, "progress", None)
    if fn is None:
        return 0, 0
    try:
        cost = fn()
    except Exception:
        return 0, 0
    return int(cost.steps), int(cost.output_tokens)


def execute_one(
    target: FuzzTarget, data: bytes, probe: MemProbe, soft_timeout_s: float | None
) -> RawResult:
    """Run one input in this process and measure it. ``soft_timeout_s``: CPU seconds before
    :class:`SoftTimeout` is raised inside the target (main thread only; None: no timer)."""
    # Only with our SIGPROF handler installed (its default action would kill the process) and
    # in the main thread (where Python runs signal handlers).
    timer = (
        soft_timeout_s is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGPROF) is on_timer
    )
    probe.start()
    cpu0 = time.thread_time()
    t0 = time.perf_counter()
    steps = tokens = 0
    status = ExecStatus.OK
    err_type = err_msg = where = code = None
    try:
        if timer:
            assert soft_timeout_s is not None
            signal.setitimer(signal.ITIMER_PROF, soft_timeout_s)
        try:
            cost = target.execute(data)
        finally:
            if timer:
                signal.setitimer(signal.ITIMER_PROF, 0)
        steps, tokens = cost.steps, cost.output_tokens
    except SoftTimeout:
        status, err_type = ExecStatus.SOFT_TIMEOUT, "Timeout"
        steps, tokens = _progress(target)
    except MemoryError as exc:
        status, err_type, err_msg = ExecStatus.MEMORY, "MemoryError", str(exc)[:500] or "memory cap"
        steps, tokens = _progress(target)
    except target.expected as exc:
        status, err_type = ExecStatus.REJECTED, type(exc).__name__
        c = getattr(exc, "code", None)
        code = c if isinstance(c, str) else None
        err_msg = str(exc)[:500]
        steps, tokens = _progress(target)
    except Exception as exc:
        status, err_type, err_msg = ExecStatus.EXCEPTION, type(exc).__name__, str(exc)[:2000]
        where = _where(exc.__traceback__)
        steps, tokens = _progress(target)
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - cpu0
    return RawResult(
        status,
        wall,
        cpu,
        probe.peak_growth(),
        steps,
        tokens,
        err_type,
        err_msg,
        where,
        code,
        _process_cpu(),
    )


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------------- processes


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _worker_main(target: FuzzTarget, sock: socket.socket, headroom: int, soft_s: float) -> None:
    """Serve batches until EOF; exit after a timeout or MemoryError (state may be damaged)."""
    probe = MemProbe()
    with contextlib.suppress(ValueError, OSError):
        limit = probe.vm_size() + headroom
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGPROF, on_timer)
    while True:
        head = _recv_exact(sock, 4)
        if head is None:
            return
        (count,) = _U32.unpack(head)
        inputs: list[bytes] = []
        for _ in range(count):
            size = _recv_exact(sock, 4)
            if size is None:
                return
            body = _recv_exact(sock, _U32.unpack(size)[0])
            if body is None:
                return
            inputs.append(body)
        for data in inputs:
            raw = execute_one(target, data, probe, soft_s)
            blob = pickle.dumps(astuple(raw), protocol=pickle.HIGHEST_PROTOCOL)
            sock.sendall(_U32.pack(len(blob)) + blob)
            if raw.status in (ExecStatus.MEMORY, ExecStatus.SOFT_TIMEOUT):
                return  # the caller restarts a clean worker for the rest of the batch


def _zygote_main(target_name: str, ctrl_fd: int, headroom: int, soft_s: float) -> None:
    from fuzz.targets import get_target

    # No PR_SET_PDEATHSIG here (it follows the creating *thread*): the zygote leaves when its
    # control socket reaches EOF, which the caller's death also causes.
    ctrl = socket.socket(fileno=ctrl_fd)
    target = get_target(target_name)
    warmup = getattr(target, "warmup", None)
    if warmup is not None:
        warmup()
    freeze_heap()
    children: set[int] = set()
    ctrl.sendall(b"R")  # warm: the caller may start timing now
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 16, 1)
        except OSError:
            msg, fds = b"", []
        if not msg:
            break
        op = msg[:1]
        if op == b"S" and fds:
            pid = os.fork()
            if pid == 0:  # the worker
                try:
                    ctrl.close()
                    with contextlib.suppress(OSError):
                        os.setpgid(0, 0)
                    _die_with_parent()
                    _worker_main(target, socket.socket(fileno=fds[0]), headroom, soft_s)
                finally:
                    os._exit(0)
            os.close(fds[0])
            children.add(pid)
            ctrl.sendall(_PID.pack(pid, 0))
        elif op == b"W":
            (pid,) = struct.unpack("!i", msg[1:5])
            status = 0
            if pid in children:
                children.discard(pid)
                with contextlib.suppress(ChildProcessError):
                    _, status = os.waitpid(pid, 0)
            ctrl.sendall(_PID.pack(pid, status))
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


if __name__ == "__main__":
    # Run the module's own copy (not __main__'s), so what it pickles names fuzz._worker.
    from fuzz._worker import _zygote_main as main

    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
