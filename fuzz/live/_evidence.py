"""What the upstream itself says about a finding: its log, its signal, the kernel, its usage.

A black-box verdict (no answer, a 500) says that something broke, not what. When the campaign
can read the server's log (it started the server, or was told where the log is:
:class:`ServerLog`), the lines the server wrote while the request ran name the cause: the
exception type and innermost frames of a Python traceback, or the signal and the Python stack
of a crash (``Fatal Python error: Segmentation fault`` with the stack faulthandler prints:
the upstream scripts start their servers with ``PYTHONFAULTHANDLER=1``). The kernel's
``segfault``/OOM lines are added when ``dmesg`` may be read here. :func:`parse_log` turns an
excerpt into :class:`Evidence`, whose :attr:`~Evidence.signature` is the triage's cause
signature (``SIGSEGV@llama_cpp/_internals.py:add_grammar``); frames without line numbers, so
that one bug keeps one signature across the upstream's versions.

:func:`usage_of` reads the resident memory and CPU time of the watched processes, which the
report shows before and after the request.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "Evidence",
    "Frame",
    "ServerLog",
    "kernel_lines",
    "kernel_lines_about",
    "parse_log",
    "relative_module",
    "usage_of",
]

# The most of a log the campaign reads per request (a server that logs every request body
# must not make the campaign read megabytes).
_MAX_READ = 256 << 10
_EXCERPT_LINES = 40
# Frames of the web and async plumbing every Python server shares: a cause is never there.
_PLUMBING = (
    "starlette/",
    "fastapi/",
    "uvicorn/",
    "anyio/",
    "sse_starlette/",
    "pydantic/",
    "pydantic_core/",
    "asyncio/",
    "concurrent/",
    "threading.py",
    "contextlib.py",
    "runpy.py",
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+),? in (\S+)')
_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Fault|Failure))(?::\s*(.*))?$"
)
_FATAL = re.compile(r"Fatal Python error: (.+?)\s*$")
_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
# Exceptions of a client that went away (a timed-out request of the campaign's): another
# request's noise in the log, not a cause.
_TRANSPORT_NOISE = frozenset(
    {"BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError", "CancelledError"}
)
_KERNEL = re.compile(r"segfault at|general protection|Out of memory|oom-kill|Killed process")


@dataclass(frozen=True)
class Frame:
    """One stack frame: the module path inside its package (``vllm/v1/engine/core.py``; no
    site-packages prefix), the line and the function."""

    module: str
    line: int
    function: str
    stdlib: bool = False

    @property
    def plumbing(self) -> bool:
        """The standard library's, or the web and async plumbing's: never a cause."""
        return self.stdlib or self.module.startswith(_PLUMBING)

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.function}"


@dataclass
class Evidence:
    """What a log excerpt shows: ``signal`` (``SIGSEGV``) or ``exception`` (its type) and
    ``message``, ``frames`` innermost first, the ``excerpt`` itself (last lines), ``kernel``
    lines when readable."""

    excerpt: str = ""
    exception: str | None = None
    message: str | None = None
    signal: str | None = None
    frames: list[Frame] = field(default_factory=list)
    kernel: list[str] = field(default_factory=list)

    @property
    def culprit(self) -> Frame | None:
        """The innermost frame that is not web or async plumbing (else the innermost one)."""
        for f in self.frames:
            if not f.plumbing:
                return f
        return self.frames[0] if self.frames else None

    @property
    def signature(self) -> str | None:
        """The cause signature (``SIGSEGV@llama_cpp/_internals.py:add_grammar``,
        ``RecursionError@vllm/entrypoints/openai/tool_parsers/utils.py:partial_json_loads``),
        None when the log shows neither a signal nor an exception."""
        what = self.signal or self.exception
        if what is None:
            return None
        c = self.culprit
        return what if c is None else f"{what}@{c.module}:{c.function}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "signal": self.signal,
            "exception": self.exception,
            "message": self.message,
            "frames": [str(f) for f in self.frames[:8]],
            "culprit": None if self.culprit is None else str(self.culprit),
            "kernel": self.kernel,
            "log_excerpt": self.excerpt,
        }


class ServerLog:
    """The server's log file, read from a mark on (a restarted server that truncated it is read
    from its start)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def mark(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def since(self, mark: int) -> str:
        try:
            size = self.path.stat().st_size
            start = mark if size >= mark else 0
            start = max(start, size - _MAX_READ)
            with self.path.open("rb") as f:
                f.seek(start)
                return f.read(_MAX_READ).decode("utf-8", "replace")
        except OSError:
            return ""


def _frame(path: str, line: str, function: str) -> Frame:
    stdlib = bool(re.search(r"/lib/python3\.\d+/", path)) and "-packages/" not in path
    return Frame(relative_module(path), int(line), function, stdlib)


def relative_module(path: str) -> str:
    """``/x/venv/lib/python3.11/site-packages/llama_cpp/llama.py`` -> ``llama_cpp/llama.py``;
    a standard-library module keeps its name inside the library (``json/decoder.py``)."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    m = re.search(r"/lib/python3\.\d+/(.+)$", path)
    if m:
        return m.group(1)
    return path.rsplit("/", 1)[-1]


def parse_log(text: str) -> Evidence:
    """The evidence in a log excerpt (see the module docstring)."""
    lines = text.splitlines()
    ev = Evidence(excerpt="\n".join(lines[-_EXCERPT_LINES:]))
    fatal = [i for i, line in enumerate(lines) if _FATAL.search(line)]
    if fatal:
        i = fatal[-1]
        reason = _FATAL.search(lines[i])
        assert reason is not None
        ev.signal = _SIGNALS.get(reason.group(1), reason.group(1))
        ev.frames = _faulthandler_frames(lines[i + 1 :])
        ev.excerpt = "\n".join(lines[max(0, i - 5) :][:_EXCERPT_LINES])
        return ev
    for line in reversed(lines):
        for text_, sig in _SIGNALS.items():
            if text_ in line and ("core dumped" in line or line.strip().startswith(text_)):
                ev.signal = sig
                return ev
    blocks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    # The last traceback that is not a client's connection going away (another request's).
    for start in reversed(blocks):
        exception, message, frames = _traceback(lines[start + 1 :])
        if exception in _TRANSPORT_NOISE:
            continue
        ev.exception, ev.message, ev.frames = exception, message, frames
        ev.excerpt = "\n".join(lines[max(0, start - 2) :][:_EXCERPT_LINES])
        break
    return ev


def _traceback(lines: Sequence[str]) -> tuple[str | None, str | None, list[Frame]]:
    """The exception type, message and frames (innermost first) of one traceback's lines."""
    frames: list[Frame] = []
    for line in lines:
        m = _FRAME.match(line)
        if m:
            frames.append(_frame(m.group(1), m.group(2), m.group(3)))
            continue
        e = _EXCEPTION.match(line.strip()) if not line.startswith(" ") else None
        if e:
            return e.group(1).rsplit(".", 1)[-1], (e.group(2) or "")[:500] or None, frames[::-1]
    return None, None, frames[::-1]


def _faulthandler_frames(lines: Sequence[str]) -> list[Frame]:
    """The frames of faulthandler's ``Current thread`` block (innermost first, as printed)."""
    frames: list[Frame] = []
    started = False
    for line in lines:
        if line.startswith(("Current thread", "Thread 0x")):
            if started:
                break
            started = line.startswith("Current thread")
            continue
        if not started:
            continue
        m = _FRAME.match(line)
        if not m:
            if frames:
                break
            continue
        frames.append(_frame(m.group(1), m.group(2), m.group(3)))
    return frames


def kernel_lines(pids: Sequence[int], limit: int = 3, timeout_s: float = 2.0) -> list[str]:
    """The kernel's last segfault/OOM lines about ``pids`` (the server's processes), when
    ``dmesg`` may be read here (often not in a container: then none). Lines about other
    processes are left out: on a shared machine they are someone else's crash."""
    if not pids:
        return []
    try:
        out = subprocess.run(
            ["dmesg"], capture_output=True, timeout=timeout_s, check=False, text=True
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return kernel_lines_about(out.stdout, pids)[-limit:]


def kernel_lines_about(text: str, pids: Sequence[int]) -> list[str]:
    """The segfault/OOM lines of a kernel log that name one of ``pids``
    (``python[123]: segfault at ...``, ``Killed process 123 (python)``)."""
    marks = tuple(f"[{pid}]" for pid in pids) + tuple(f"process {pid} " for pid in pids)
    return [
        line for line in text.splitlines() if _KERNEL.search(line) and any(m in line for m in marks)
    ]


def usage_of(pids: Sequence[int]) -> dict[str, float] | None:
    """Resident memory and CPU time (user + system) of ``pids`` and their children; None when
    none is watched or none can be read."""
    rss = 0
    cpu = 0.0
    seen = False
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue  # died: no memory, and not the server any more
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    cpu += t.user + t.system
                    seen = True
    return {"rss_bytes": rss, "cpu_s": round(cpu, 3)} if seen else None
