"""llama.cpp's grammar sampler built for one GBNF grammar in a forked child, and what happened.

llama-cpp-python 0.3.36 builds a request's ``grammar`` with ``llama_sampler_init_grammar(vocab,
text, "root")`` (``LlamaSampler.add_grammar``): llama.cpp parses the text, checks it, detects
left recursion and builds the initial parse stacks; NULL means it refused the grammar. A
grammar may also crash it (SIGSEGV), abort it (a C++ exception such as ``std::bad_alloc``
escaping: SIGABRT), or never return. So each build runs in a child forked from the warm fuzz
worker (which has the model's vocabulary loaded: a fork costs a few ms), under its own CPU
limit (``RLIMIT_CPU``: SIGXCPU), address-space cap and a wall-clock kill, and the parent reads
what became of it: :class:`BuildOutcome`. The child then walks a few decode steps as a sampler
would (``llama_sampler_apply`` over the whole vocabulary, one allowed token ``accept``-ed),
where llama.cpp's matcher runs: a token its own mask allowed that ``accept`` then refuses
aborts the process (its ``std::runtime_error`` crosses the C API).

llama-cpp-python is not in schedguard's venv: it is the upstream the test scripts install
(``scripts/upstreams/upstreams.py setup llamacpp``: a venv of the same CPython, and a tiny GGUF
model whose vocabulary the grammar's masks are over). :func:`locate` finds both;
:func:`load` puts that venv's ``site-packages`` at the end of ``sys.path`` (fuzz.targets._upstream_venv; llama-cpp-python
is ctypes over ``libllama.so``: no extension module of its own; its numpy must match this
interpreter, so the venv's Python version must be this one's) and loads the vocabulary.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import faulthandler
import json
import os
import random
import re
import resource
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fuzz.targets._upstream_venv import import_from, site_packages, upstreams_root

__all__ = [
    "VERSION",
    "BuildLimits",
    "BuildOutcome",
    "LlamaCppGrammar",
    "Located",
    "build",
    "load",
    "locate",
]

VERSION = "0.3.36"
BuildStatus = Literal["accepted", "rejected", "signal", "memory", "time", "starved", "error"]
# Where the child was when it died: parse + init, a token mask, accepting a token.
Phase = Literal["build", "apply", "accept", "-"]

_PR_SET_PDEATHSIG = 1
_EXIT_OK = 0
_EXIT_ERROR = 3
_EXIT_MEMORY = 4
_LOG_TAIL = 4000
_NEG_INF = float("-inf")


@dataclass(frozen=True)
class Located:
    """Where llama-cpp-python and its model are; ``problem`` says why they cannot be used."""

    site_packages: Path | None
    model: Path | None
    problem: str | None


def locate() -> Located:
    """The upstream venv's ``site-packages`` holding llama-cpp-python 0.3.36 and the tiny model."""
    site = site_packages("llamacpp", "llama_cpp_python", VERSION)
    if site.path is None:
        return Located(None, None, site.problem)
    model = upstreams_root() / "llamacpp" / "model" / "model.gguf"
    if not model.is_file():
        setup = "python3 scripts/upstreams/upstreams.py setup llamacpp"
        return Located(None, None, f"the tiny model {model} is missing: {setup}")
    return Located(site.path, model, None)


@dataclass(frozen=True)
class BuildLimits:
    """The child's limits: CPU seconds (``RLIMIT_CPU``), address space above the worker's,
    wall seconds before it is killed (a child blocked or starved), decode steps walked."""

    # Just over the target's budgets (1 s, 256 MiB): past them the finding is made, so a
    # runaway build need not go further; the wall clock well inside the oracle's 10 s kill.
    cpu_s: int = 2
    mem_bytes: int = 320 << 20
    wall_s: float = 4.0
    walk_steps: int = 8


@dataclass(frozen=True)
class BuildOutcome:
    """What one build did. ``status``: ``accepted`` / ``rejected`` (llama.cpp returned NULL)
    when the child finished; ``signal`` (``signal`` names it), ``memory`` (an allocation
    failed: ``std::bad_alloc`` or MemoryError), ``time`` (the CPU limit, or killed at the
    wall-clock limit after half of it in CPU), ``starved`` (killed at the wall-clock limit
    having had less: a loaded machine, no verdict), ``error`` (the child's own Python failed:
    a harness bug) when it died. ``phase``: where
    it was. ``build_cpu_s``: parse and init; ``mask_cpu_s``: the dearest token mask;
    ``peak_bytes``: the child's peak RSS growth; ``log``: the tail of what llama.cpp wrote
    (its refusal reason, an abort message)."""

    status: BuildStatus
    phase: Phase = "-"
    signal: str | None = None
    build_cpu_s: float = 0.0
    mask_cpu_s: float = 0.0
    cpu_s: float = 0.0
    peak_bytes: int = 0
    walked: int = 0
    log: str = ""

    def reason(self) -> str:
        """llama.cpp's own words: its parse error, or the abort's message, else ''."""
        for pattern in (
            r"error parsing grammar: ([^\n]*)",
            r"what\(\):\s*([^\n]*)",
            r"(GGML_ASSERT\([^\n]*)",
            r"([^\n]*(?:error|failed|unsupported)[^\n]*)",
        ):
            m = re.search(pattern, self.log)
            if m:
                return m.group(1).strip()[:300]
        lines = [line.strip() for line in self.log.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""


class LlamaCppGrammar:
    """llama.cpp's bindings and the model's vocabulary, loaded once in the worker; the masks'
    candidate array built once and copied by every fork."""

    def __init__(self, lib: Any, vocab: Any, model: Any) -> None:
        self.lib = lib
        self.vocab = vocab
        self._model = model  # kept alive: the vocabulary belongs to it
        self.n_vocab = int(lib.llama_vocab_n_tokens(vocab))
        self.eog = frozenset(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(vocab, t))
        self._data = (lib.llama_token_data * self.n_vocab)()
        for i in range(self.n_vocab):
            self._data[i].id = i
            self._data[i].logit = 0.0
            self._data[i].p = 0.0
        self._pristine = bytes(self._data)
        self._array = lib.llama_token_data_array(
            data=self._data, size=self.n_vocab, selected=-1, sorted=False
        )

    def allowed(self, sampler: Any) -> list[int]:
        """One token mask: the ids ``llama_sampler_apply`` leaves finite (the grammar sampler
        sets the others' logits to -inf in place, in id order)."""
        ctypes.memmove(self._data, self._pristine, len(self._pristine))
        self._array.size = self.n_vocab
        self._array.selected = -1
        self._array.sorted = False
        self.lib.llama_sampler_apply(sampler, ctypes.byref(self._array))
        # llama_token_data is (int32 id, float logit, float p): every third float is a logit.
        logits = array.array("f", bytes(self._data))[1::3]
        return [i for i, logit in enumerate(logits) if logit != _NEG_INF]


def load(located: Located) -> LlamaCppGrammar:
    """Import llama-cpp-python from the upstream venv and load the model's vocabulary only."""
    assert located.site_packages is not None and located.model is not None
    # ggml's abort handler otherwise attaches gdb to print a backtrace: seconds per abort.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    lib: Any = import_from(located.site_packages, "llama_cpp")
    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(located.model).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load the vocabulary of {located.model}")
    return LlamaCppGrammar(lib, lib.llama_model_get_vocab(model), model)


# ---- the child ---------------------------------------------------------------------------------


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _vm_size() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _rss_and_reset() -> int:
    """This process's RSS now, with the kernel's high-water mark reset to it."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "wb") as f:
        f.write(b"5")
    return _status_kib(b"VmRSS:") * 1024


def _status_kib(field: bytes) -> int:
    try:
        with open("/proc/self/status", "rb") as f:
            text = f.read()
        i = text.find(field)
        return int(text[i + len(field) : text.find(b"kB", i)]) if i >= 0 else 0
    except (OSError, ValueError):
        return 0


def _child(
    env: LlamaCppGrammar, grammar: bytes, out_fd: int, limits: BuildLimits, seed: int
) -> int:
    """Build, walk, report on ``out_fd`` (phase marks, then one JSON line); the exit code."""
    lib = env.lib
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_size() + limits.mem_bytes
    if soft == resource.RLIM_INFINITY or cap < soft:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    base = _rss_and_reset()
    os.write(out_fd, b"B")
    t0 = time.process_time()
    sampler = lib.llama_sampler_init_grammar(env.vocab, grammar, b"root")
    build_cpu = time.process_time() - t0
    result: dict[str, Any] = {"build_cpu_s": build_cpu, "mask_cpu_s": 0.0, "walked": 0}
    if not sampler:
        result["status"] = "rejected"
    else:
        result["status"] = "accepted"
        rng = random.Random(seed)
        for step in range(limits.walk_steps):
            os.write(out_fd, b"A")
            t0 = time.process_time()
            allowed = env.allowed(sampler)
            result["mask_cpu_s"] = max(result["mask_cpu_s"], time.process_time() - t0)
            # A model under the grammar ends when end-of-generation is its best choice; the
            # walk prefers text, so the matcher goes deeper.
            text = [t for t in allowed if t not in env.eog]
            if not text:
                break
            os.write(out_fd, b"C")
            lib.llama_sampler_accept(sampler, rng.choice(text))
            result["walked"] = step + 1
    result["peak_bytes"] = max(0, _status_kib(b"VmHWM:") * 1024 - base)
    os.write(out_fd, b"\n" + json.dumps(result).encode())
    return _EXIT_OK


def _fork_child(
    env: LlamaCppGrammar, grammar: bytes, out_w: int, log_fd: int, limits: BuildLimits, seed: int
) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = _EXIT_ERROR
    try:
        faulthandler.disable()  # a crash here is the finding: no Python traceback for it
        os.dup2(log_fd, 2)  # llama.cpp's log and an abort's message, for the parent to read
        _die_with_parent()
        signal.signal(signal.SIGPROF, signal.SIG_IGN)  # the worker's soft timer is not ours
        code = _child(env, grammar, out_w, limits, seed)
    except MemoryError:
        code = _EXIT_MEMORY
    except BaseException as exc:
        with contextlib.suppress(Exception):
            os.write(2, f"\nharness: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(code)


# ---- the parent --------------------------------------------------------------------------------


_PHASES: dict[int, Phase] = {ord("B"): "build", ord("A"): "apply", ord("C"): "accept"}


def _wait(pid: int, wall_s: float, cpu_s: float) -> tuple[int, Any, str | None]:
    """``wait4`` the child, killing it at ``wall_s``: (status, rusage, None or why it was
    killed: ``killed``, or ``starved`` when it had less than half its CPU limit by then)."""
    deadline = time.monotonic() + wall_s
    pidfd = -1
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return status, usage, None
            left = deadline - time.monotonic()
            if left <= 0:
                starved = _cpu_of(pid) < cpu_s / 2
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                return status, usage, "starved" if starved else "killed"
            if pidfd >= 0:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.002))
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def build(
    env: LlamaCppGrammar, grammar: bytes, limits: BuildLimits | None = None, seed: int = 1
) -> BuildOutcome:
    """Build ``grammar`` (the bytes llama-cpp-python passes: UTF-8, read up to a NUL) in a
    forked child and say what became of it."""
    limits = limits or BuildLimits()
    out_r, out_w = os.pipe()
    log_fd = os.memfd_create("llamacpp-grammar-log")
    rss_before = _status_kib(b"VmRSS:") * 1024
    pid = -1
    try:
        pid = _fork_child(env, grammar, out_w, log_fd, limits, seed)
        os.close(out_w)
        out_w = -1
        status, usage, killed = _wait(pid, limits.wall_s, limits.cpu_s)
        pid = -1
        report = _read_all(out_r)
        log = os.pread(log_fd, 1 << 20, 0).decode("utf-8", "replace")[-_LOG_TAIL:]
    finally:
        if pid > 0:  # interrupted (the worker's soft timer): leave no child behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for fd in (out_r, out_w, log_fd):
            if fd >= 0:
                os.close(fd)
    return _outcome(status, usage, killed, report, log, rss_before)


def _cpu_of(pid: int) -> float:
    """CPU seconds of a running process (``/proc/<pid>/stat``; 0.0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _outcome(
    status: int, usage: Any, killed: str | None, report: bytes, log: str, rss_before: int
) -> BuildOutcome:
    marks, _, line = report.partition(b"\n")
    phase: Phase = _PHASES.get(marks[-1], "-") if marks else "-"
    cpu = float(usage.ru_utime + usage.ru_stime)
    # A child that died has no report: its peak is its kernel high-water mark (the pages it
    # shares with the worker count from the fork) less the worker's RSS then.
    peak = max(0, int(usage.ru_maxrss) * 1024 - rss_before)
    common: dict[str, Any] = {"phase": phase, "cpu_s": cpu, "peak_bytes": peak, "log": log}
    if killed == "starved":
        return BuildOutcome("starved", signal="SIGKILL", **common)
    if killed:
        return BuildOutcome("time", signal="SIGKILL", **common)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = _signal_name(sig)
        if sig == signal.SIGXCPU:
            return BuildOutcome("time", signal=name, **common)
        if sig == signal.SIGABRT and "bad_alloc" in log:
            return BuildOutcome("memory", signal=name, **common)
        return BuildOutcome("signal", signal=name, **common)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else _EXIT_ERROR
    if code == _EXIT_MEMORY:
        return BuildOutcome("memory", **common)
    if code != _EXIT_OK or not line:
        return BuildOutcome("error", **common)
    doc = json.loads(line)
    return BuildOutcome(
        doc["status"],
        phase="-",
        build_cpu_s=float(doc["build_cpu_s"]),
        mask_cpu_s=float(doc["mask_cpu_s"]),
        cpu_s=cpu,
        peak_bytes=int(doc["peak_bytes"]),
        walked=int(doc["walked"]),
        log=log,
    )


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
