"""The resource oracle: run inputs against a target under its budgets and call each one.

Verdicts, in precedence order: ``crash`` (an exception the target does not document, or the
worker died by a signal), ``oom`` (``MemoryError`` under the worker's ``RLIMIT_AS``),
``timeout`` (stopped at the wall budget), ``budget`` (finished but crossed the wall, memory,
output-token or step budget), ``cost_per_byte`` (cost / input size above the threshold), then
``rejected`` (a documented rejection) and ``ok``. Every outcome carries the measured cost.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fuzz._exceptions import WorkerError
from fuzz._worker import ExecStatus, MemProbe, RawResult, execute_one, freeze_heap, on_timer
from fuzz.targets import Budgets, Cost

__all__ = ["FINDING_VERDICTS", "Oracle", "OracleVerdict", "Outcome", "classify"]

# The last three come from live targets (fuzz.live): a 5xx answer, an upstream cost above what
# the guard accounted, a benign request the guard refuses that the upstream serves cheaply.
OracleVerdict = Literal[
    "ok",
    "rejected",
    "crash",
    "timeout",
    "oom",
    "budget",
    "cost_per_byte",
    "server_error",
    "undercount",
    "false_positive",
]
FINDING_VERDICTS: frozenset[str] = frozenset(
    {
        "crash",
        "timeout",
        "oom",
        "budget",
        "cost_per_byte",
        "server_error",
        "undercount",
        "false_positive",
    }
)


@dataclass(frozen=True)
class Outcome:
    """What one input did. ``where`` is the innermost project frame of a crash (``file:line
    function``) or the budget crossed (``budget:wall_s`` ...); ``error_code`` is the GuardError
    code of a rejection."""

    verdict: OracleVerdict
    cost: Cost
    error_type: str | None = None
    error_message: str | None = None
    where: str | None = None
    error_code: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def is_finding(self) -> bool:
        return self.verdict in FINDING_VERDICTS

    @property
    def cause(self) -> str:
        """The dedup key: verdict + error type + top frame or budget crossed."""
        return f"{self.verdict}:{self.error_type or '-'}:{self.where or '-'}"

    def summary(self) -> str:
        """One line: the cause, the cost and the error (the atheris harness's crash message)."""
        return (
            f"{self.cause} cost={self.cost.to_dict()} "
            f"{self.error_type or ''}: {(self.error_message or '')[:200]}"
        )


def classify(raw: RawResult, budgets: Budgets, size: int) -> Outcome:
    """The verdict of one measured execution (see the module docstring for the precedence).

    Time budgets are checked against the input's CPU time, which other load on a shared machine
    does not inflate; the hard kill (``timeout`` from the caller's side) uses the wall clock.
    """
    cost = Cost(
        time_s=raw.wall_s,
        peak_mem_bytes=raw.mem_bytes,
        steps=raw.steps,
        output_tokens=raw.output_tokens,
        cpu_s=raw.cpu_s,
    )
    status = raw.status
    if status == ExecStatus.EXCEPTION:
        return Outcome("crash", cost, raw.error_type, raw.error_message, raw.where)
    if status == ExecStatus.MEMORY:
        return Outcome("oom", cost, "MemoryError", raw.error_message, "oom")
    if status == ExecStatus.SOFT_TIMEOUT:
        return Outcome("timeout", cost, "Timeout", f"over {budgets.wall_s} s", "timeout")
    crossed = _budget_crossed(cost, budgets)
    if crossed is not None:
        return Outcome(
            "budget", cost, raw.error_type, raw.error_message, f"budget:{crossed}", raw.error_code
        )
    if budgets.cost_per_byte is not None and cost.per_byte(size) > budgets.cost_per_byte:
        return Outcome(
            "cost_per_byte",
            cost,
            raw.error_type,
            raw.error_message,
            "cost_per_byte",
            raw.error_code,
        )
    if status == ExecStatus.REJECTED:
        return Outcome("rejected", cost, raw.error_type, raw.error_message, None, raw.error_code)
    return Outcome("ok", cost)


def _budget_crossed(cost: Cost, b: Budgets) -> str | None:
    if (cost.cpu_s or cost.time_s) > b.wall_s:
        return "wall_s"
    if cost.peak_mem_bytes > b.mem_bytes:
        return "mem_bytes"
    if b.steps is not None and cost.steps > b.steps:
        return "steps"
    if b.output_tokens is not None and cost.output_tokens > b.output_tokens:
        return "output_tokens"
    return None


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class _Zygote:
    """The warm parent of the workers (see :mod:`fuzz._worker`)."""

    def __init__(self, target_name: str, headroom: int, soft_s: float) -> None:
        ctrl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PROJECT_ROOT, env.get("PYTHONPATH", "")) if p
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fuzz._worker",
                target_name,
                str(theirs.fileno()),
                str(headroom),
                str(soft_s),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self.ctrl = ctrl
        ctrl.settimeout(_ZYGOTE_START_S)
        try:
            ready = ctrl.recv(16)
        except OSError:
            ready = b""
        if ready != b"R":
            self.close()
            raise WorkerError(f"fuzz worker for {target_name!r} did not start: {self.stderr()}")
        ctrl.settimeout(_ZYGOTE_REPLY_S)

    def stderr(self) -> str:
        self._log.seek(0)
        return self._log.read()[-4000:].decode("utf-8", "replace").strip()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self) -> tuple[int, socket.socket]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.ctrl, [b"S"], [theirs.fileno()])
            reply = self.ctrl.recv(16)
        finally:
            theirs.close()
        if len(reply) != _PID.size:
            mine.close()
            raise WorkerError(f"fuzz worker could not fork: {self.stderr()}")
        pid, _ = _PID.unpack(reply)
        return pid, mine

    def reap(self, pid: int) -> int:
        """Wait for a worker (dead or killed) and return its wait status."""
        try:
            self.ctrl.sendall(b"W" + struct.pack("!i", pid))
            reply = self.ctrl.recv(16)
        except OSError:
            return 0
        return _PID.unpack(reply)[1] if len(reply) == _PID.size else 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.ctrl.close()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


_ZYGOTE_START_S = 60.0
_ZYGOTE_REPLY_S = 10.0
_PID = struct.Struct("!ii")
_U32 = struct.Struct("!I")
_MAX_BATCH_BYTES = 4 << 20
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class Oracle:
    """Executes inputs for one target under its budgets.

    ``isolate=True`` (default; mandatory for vulnerable targets): in a persistent worker
    process under ``RLIMIT_AS`` (baseline + ``max(2 * mem_bytes, 256 MiB)``), a CPU timer at
    ``wall_s`` inside the worker (catches Python loops) and a kill from here at
    ``1.5 * wall_s + 0.5`` wall seconds if the worker has burnt ``wall_s`` of CPU on the input by
    then (a loop in C), else at ``max(3, 10 * wall_s)`` (blocked, or starved by other load: a
    busy machine does not turn into findings). The worker is restarted after it dies, times out
    or runs out of memory (each is the outcome of the input that caused it). ``isolate=False``: in this process, for targets that bound
    themselves (hardened, guard), which is several times faster. ``budgets`` overrides the
    target's.
    """

    def __init__(
        self,
        target_name: str,
        *,
        isolate: bool = True,
        budgets: Budgets | None = None,
        batch_size: int = 256,
    ) -> None:
        from fuzz.targets import get_target

        self.target = get_target(target_name)
        self.name = target_name
        self.budgets = budgets or self.target.budgets
        self.isolate = isolate
        self.batch_size = batch_size
        self.execs = 0
        self.restarts = 0
        b = self.budgets
        self._headroom = max(2 * b.mem_bytes, 256 << 20)
        self._soft_s = b.wall_s
        self._hard_s = 1.5 * b.wall_s + 0.5
        # A worker that has not used its CPU budget by the kill time is starved by other load,
        # not hung: it gets until this wall-clock bound (a hang without CPU ends there too).
        self._max_wall_s = max(3.0, 10 * b.wall_s)
        self._cpu_mark = 0.0
        self._zygote: _Zygote | None = None
        self._pid = 0
        self._sock: socket.socket | None = None
        self._probe: MemProbe | None = None
        self._old_sigprof: Any = None
        if not isolate:
            warmup = getattr(self.target, "warmup", None)
            if warmup is not None:
                warmup()
            freeze_heap()
            self._probe = MemProbe()
            if threading.current_thread() is threading.main_thread():
                self._old_sigprof = signal.signal(signal.SIGPROF, on_timer)

    # ------------------------------------------------------------------------------- public

    def run(self, data: bytes) -> Outcome:
        return self.run_batch([data])[0]

    def run_batch(
        self, inputs: Sequence[bytes], *, time_limit_s: float | None = None
    ) -> list[Outcome]:
        """Outcomes of ``inputs``, in order. With ``time_limit_s`` the batch stops at the first
        input boundary after that many seconds and the result is a prefix (the input running
        at that moment is abandoned, not reported)."""
        if not inputs:
            return []
        end = None if time_limit_s is None else time.perf_counter() + time_limit_s
        results: list[Outcome] = []
        if not self.isolate:
            assert self._probe is not None
            for data in inputs:
                raw = execute_one(self.target, data, self._probe, self._soft_s)
                results.append(classify(raw, self.budgets, len(data)))
                if end is not None and time.perf_counter() > end:
                    break
            self.execs += len(results)
            return results
        pending = list(inputs)
        while pending:
            chunk = self._take(pending)
            done, cut = self._run_isolated(chunk, end)
            results.extend(done)
            del pending[: len(done)]
            if cut:
                break
        self.execs += len(results)
        return results

    def close(self) -> None:
        self._stop_worker(kill=True)
        if self._old_sigprof is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGPROF, self._old_sigprof)
            self._old_sigprof = None
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- isolated

    def _take(self, pending: list[bytes]) -> list[bytes]:
        size = 0
        n = 0
        for data in pending[: self.batch_size]:
            size += len(data) + 4
            if n and size > _MAX_BATCH_BYTES:
                break
            n += 1
        return pending[:n]

    def _ensure_worker(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = _Zygote(self.name, self._headroom, self._soft_s)
        self._pid, self._sock = self._zygote.spawn()
        self._cpu_mark = 0.0
        return self._sock

    def _stop_worker(self, *, kill: bool) -> int:
        """Close the worker's socket (it exits on EOF), kill it if asked; return its status."""
        sock, pid = self._sock, self._pid
        self._sock, self._pid = None, 0
        if sock is None:
            return 0
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        sock.close()
        return self._zygote.reap(pid) if self._zygote is not None else 0

    def _run_isolated(self, chunk: list[bytes], end: float | None) -> tuple[list[Outcome], bool]:
        out: list[Outcome] = []
        while len(out) < len(chunk):
            done, cut = self._serve(chunk[len(out) :], end)
            out.extend(done)
            if cut:
                return out, True
        return out, False

    def _serve(self, inputs: list[bytes], end: float | None) -> tuple[list[Outcome], bool]:
        """Send ``inputs`` to a worker and collect outcomes until it stops (maybe early); the
        flag is True when ``end`` cut the batch short."""
        sock = self._ensure_worker()
        frame = [_U32.pack(len(inputs))]
        for data in inputs:
            frame.append(_U32.pack(len(data)))
            frame.append(data)
        out: list[Outcome] = []
        try:
            sock.settimeout(None)
            sock.sendall(b"".join(frame))
        except OSError:
            return [self._died(0.0)], False
        buf = bytearray()
        started = time.perf_counter()
        while len(out) < len(inputs):
            # One frame per input: a frame header, then the pickled result.
            need = 4
            blob: bytes | None = None
            while True:
                if len(buf) >= need:
                    if need == 4:
                        need = 4 + _U32.unpack_from(buf)[0]
                        continue
                    blob = bytes(buf[4:need])
                    del buf[:need]
                    break
                now = time.perf_counter()
                remaining = started + self._hard_s - now
                if remaining <= 0:
                    if now - started < self._max_wall_s and not self._burnt_cpu():
                        remaining = min(0.25, started + self._max_wall_s - now)
                    else:
                        return [*out, self._hard_timeout(started)], False
                sock.settimeout(remaining)
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    return [*out, self._died(time.perf_counter() - started)], False
                buf += chunk
            raw = RawResult(*pickle.loads(blob))
            self._cpu_mark = raw.cpu_total
            out.append(classify(raw, self.budgets, len(inputs[len(out)])))
            started = time.perf_counter()
            if raw.status in (ExecStatus.MEMORY, ExecStatus.SOFT_TIMEOUT):
                self._stop_worker(kill=False)
                self.restarts += 1
                return out, False
            if end is not None and started > end and len(out) < len(inputs):
                # Out of time: drop the rest (a fork from the zygote restarts in a few ms).
                self._stop_worker(kill=True)
                return out, True
        return out, False

    def _burnt_cpu(self) -> bool:
        """Whether the worker used its CPU budget on the current input (from procfs; True
        when it cannot be read, so the wall clock decides)."""
        try:
            with open(f"/proc/{self._pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            cpu = (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, ValueError, IndexError):
            return True
        return cpu - self._cpu_mark >= self.budgets.wall_s

    def _hard_timeout(self, started: float) -> Outcome:
        wall = time.perf_counter() - started
        self._stop_worker(kill=True)
        self.restarts += 1
        return Outcome(
            "timeout",
            Cost(time_s=wall, cpu_s=wall),
            "Timeout",
            f"killed after {wall:.2f} s wall clock",
            "timeout",
        )

    def _died(self, wall: float) -> Outcome:
        status = self._stop_worker(kill=True)
        self.restarts += 1
        cost = Cost(time_s=wall, cpu_s=wall)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGKILL:
                # Not ours (we had not killed it): the kernel's OOM killer.
                return Outcome("oom", cost, "MemoryError", "worker killed (SIGKILL)", "oom")
            name = _signal_name(sig)
            return Outcome("crash", cost, name, f"worker died by {name}", f"signal:{name}")
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        return Outcome(
            "crash", cost, "WorkerExit", f"worker exited with status {code}", f"exit:{code}"
        )
