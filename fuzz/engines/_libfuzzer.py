"""The atheris engine's libFuzzer processes: start them, watch them, read what they report.

:func:`run_atheris` runs the harness (:mod:`fuzz.engines.atheris_harness`) as a subprocess in
its own process group for a duration, restarting it after a crash ends a one-job run, and
collects what libFuzzer and the harness report: its status lines (executions, coverage) from its
log, the harness's events (best cost) from the events file, and the artifacts it saves. The
parent's wall clock is the last backstop: at the deadline libFuzzer gets SIGINT (it prints its
final stats and exits), then the whole group is killed. ``jobs > 1`` uses libFuzzer's fork mode
(one child per core, crashes, timeouts and OOMs ignored so the campaign goes on).

Nothing is written into the source tree or an installed package: the working corpus, logs and
(when the committed one is missing or stale) the dictionary go to the run's directory; the
committed seed corpus ``payloads/corpus/<target>/`` is read, not written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fuzz.engines.atheris_harness import EVENTS_ENV, AtherisMode

if TYPE_CHECKING:
    from fuzz.targets import Budgets, FuzzTarget

__all__ = [
    "CORPUS_ROOT",
    "DICTIONARY_DIR",
    "PROJECT_ROOT",
    "LibFuzzerRun",
    "dictionary_text",
    "run_atheris",
    "seed_corpus_dir",
    "write_dictionary",
]

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS_ROOT = PROJECT_ROOT / "payloads" / "corpus"
DICTIONARY_DIR = PROJECT_ROOT / "fuzz" / "dictionaries"
_HARNESS_CAP_BYTES = 4 << 30  # outer RLIMIT_AS until the harness sets its own, tighter one
_ARTIFACT_KINDS = ("crash-", "timeout-", "oom-")
_GRACE_S = 3.0  # after SIGINT at the deadline, before SIGKILL
_TICK_S = 0.1


# ----------------------------------------------------------------------- dictionary, seeds


def dictionary_text(target: FuzzTarget) -> str:
    """The target's grammar tokens in libFuzzer's ``-dict`` format (one quoted entry a line)."""
    lines = [f"# {target.name}: generated from the target's dictionary(); do not edit"]
    for i, token in enumerate(target.dictionary()):
        lines.append(f'kw{i}="{_escape(token)}"')
    return "\n".join(lines) + "\n"


def _escape(token: bytes) -> str:
    out = []
    for byte in token:
        ch = chr(byte)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\x{byte:02X}")
    return "".join(out)


def write_dictionary(target: FuzzTarget, directory: Path) -> Path:
    """``directory/<target>.dict``, written when missing or stale."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{target.name}.dict"
    text = dictionary_text(target)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _dictionary_for(target: FuzzTarget, work: Path) -> Path:
    """The committed ``fuzz/dictionaries/<target>.dict`` when it is current (ClusterFuzzLite
    builds with it too), else a fresh one in ``work``."""
    committed = DICTIONARY_DIR / f"{target.name}.dict"
    with contextlib.suppress(OSError):
        if committed.read_text() == dictionary_text(target):
            return committed
    return write_dictionary(target, work)


def seed_corpus_dir(target: FuzzTarget, root: Path) -> Path:
    """``root/<target>/``, holding at least the target's trivial seeds (one file each, named
    by content hash as libFuzzer names its units)."""
    directory = root / target.name
    directory.mkdir(parents=True, exist_ok=True)
    for seed in target.seeds():
        path = directory / hashlib.sha1(seed).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
    return directory


# ------------------------------------------------------------------------ what a run saw


@dataclass
class LibFuzzerRun:
    """What one :func:`run_atheris` call saw (summed over libFuzzer restarts)."""

    mode: AtherisMode
    execs: int = 0
    wall_s: float = 0.0
    coverage: int | None = None
    features: int | None = None
    artifacts: list[Path] = field(default_factory=list)
    best_cost_over_time: list[tuple[float, float]] = field(default_factory=list)
    restarts: int = 0
    log_path: Path | None = None
    # Seconds libFuzzer spent fuzzing (from its first status line), and starting up.
    fuzz_s: float = 0.0
    startup_s: float = 0.0

    @property
    def execs_per_s(self) -> float:
        """Executions per second of fuzzing (harness start-up excluded)."""
        return self.execs / self.fuzz_s if self.fuzz_s > 0 else 0.0


# "#4096 pulse cov: 83 ft: 120 corp: 9/130b lim: 43 exec/s: 2048 rss: 61Mb" and fork mode's
# "#20000: cov: 83 ft: 120 corp: 9 exec/s 1000 oom/timeout/crash: 0/0/1 time: 9s job: 2 ..."
_STATUS = re.compile(rb"^#(\d+):?\s+(?:[A-Z]+\s+)?cov: (\d+) ft: (\d+)")
_DONE = re.compile(rb"^Done (\d+) runs in")
_FINAL_EXECS = re.compile(rb"^stat::number_of_executed_units: (\d+)")


class _Lines:
    """Reads the complete lines a growing file has gained since the last read."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")
        self._partial = b""

    def read(self) -> list[bytes]:
        chunk = self._f.read()
        if not chunk:
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return lines

    def close(self) -> None:
        self._f.close()


class _LogTail(_Lines):
    """Keeps the latest libFuzzer counters from its log."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.execs = 0
        self.cov: int | None = None
        self.ft: int | None = None
        self.final: int | None = None
        # When libFuzzer's loop began (its first status line): startup (imports, instrumentation,
        # warm-up) is not fuzzing time.
        self.started_at: float | None = None

    def poll(self) -> None:
        for line in self.read():
            m = _STATUS.match(line)
            if m:
                if self.started_at is None:
                    self.started_at = time.monotonic()
                self.execs = max(self.execs, int(m.group(1)))
                self.cov, self.ft = int(m.group(2)), int(m.group(3))
                continue
            m = _DONE.match(line) or _FINAL_EXECS.match(line)
            if m:
                self.final = int(m.group(1))

    def total_execs(self) -> int:
        return self.final if self.final is not None else self.execs


class _EventTail(_Lines):
    """Reads the harness's events (:class:`fuzz.engines.atheris_harness.EventLog`)."""

    def __init__(self, path: Path) -> None:
        path.touch()
        super().__init__(path)

    def poll(self) -> list[tuple[float, str, str]]:
        out = []
        for line in self.read():
            parts = line.decode("utf-8", "replace").split(" ", 2)
            if len(parts) == 3:
                with contextlib.suppress(ValueError):
                    out.append((float(parts[0]), parts[1], parts[2]))
        return out


# ---------------------------------------------------------------------------- processes


def _wrapper_script(
    work: Path, target_name: str, mode: AtherisMode, budgets: Budgets | None = None
) -> Path:
    """An executable argv0 for libFuzzer (fork mode re-runs argv[0] for each job)."""
    path = work / f"harness-{mode}.sh"
    extra = ""
    if budgets is not None:
        extra = f" --budgets {shlex.quote(json.dumps(budgets.to_dict()))}"
    path.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} -m fuzz.engines.atheris_harness "
        f'--target {shlex.quote(target_name)} --mode {mode}{extra} --argv0 "$0" -- "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@dataclass
class _Hooks:
    """How the caller follows and steers a run (see :func:`run_atheris`)."""

    stop_on_first: bool = False
    should_stop: Callable[[], bool] | None = None
    on_exit: Callable[[], None] | None = None
    on_tick: Callable[[LibFuzzerRun, float], None] | None = None
    on_artifact: Callable[[Path, float], None] | None = None

    def stop_now(self) -> bool:
        return self.should_stop is not None and self.should_stop()


class _Session:
    """One :func:`run_atheris` call: its directories and flags, and the libFuzzer processes it
    starts one after another until the deadline."""

    def __init__(
        self, work: Path, target: FuzzTarget, mode: AtherisMode, hooks: _Hooks, flags: list[str]
    ) -> None:
        self.work = work
        self.mode = mode
        self.hooks = hooks
        self.flags = flags
        self.artifacts = work / "artifacts"
        self.corpus = work / "corpus"
        for d in (self.artifacts, self.corpus):
            d.mkdir(parents=True, exist_ok=True)
        # libFuzzer writes new units to the first corpus directory only: the others (the
        # target's seeds, and the committed seed corpus when there is one) are only read.
        self.seed_dirs = [str(seed_corpus_dir(target, work / "seeds"))]
        committed = CORPUS_ROOT / target.name
        if committed.is_dir():
            self.seed_dirs.append(str(committed))
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), self.env.get("PYTHONPATH")) if p
        )
        events_path = work / f"events-{mode}.log"
        self.env[EVENTS_ENV] = str(events_path)
        self.events = _EventTail(events_path)
        self.seen: set[str] = {p.name for p in self.artifacts.iterdir()}
        self.run = LibFuzzerRun(mode=mode)
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def go(self, argv0: Path, deadline: float) -> LibFuzzerRun:
        """libFuzzer processes one after another until the deadline (or a stop)."""
        run = self.run
        try:
            while deadline - time.monotonic() >= 1.0:
                returncode, found_now, stopped = self._one_process(argv0, deadline)
                if stopped or (self.hooks.stop_on_first and run.artifacts):
                    break
                if self.hooks.on_exit is not None:
                    self.hooks.on_exit()
                if self.hooks.stop_now():
                    break
                if returncode not in (0, None) and not found_now:
                    # The harness failed without an artifact (import error, bad flag): no retry.
                    break
                if time.monotonic() >= deadline - 1.0:
                    break
                run.restarts += 1
        finally:
            self.events.close()
            run.wall_s = self.elapsed()
        return run

    def _one_process(self, argv0: Path, deadline: float) -> tuple[int | None, bool, bool]:
        """Run libFuzzer once; (its exit status, whether it saved an artifact, whether the
        caller stopped it)."""
        remaining = deadline - time.monotonic()
        log = self.work / f"libfuzzer-{self.mode}-{self.run.restarts}.log"
        self.run.log_path = log
        cmd = [str(argv0), *self.flags, f"-max_total_time={max(1, int(remaining))}"]
        cmd += [str(self.corpus), *self.seed_dirs]
        with log.open("wb") as log_f:
            proc = subprocess.Popen(
                cmd,
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        spawned = time.monotonic()
        with contextlib.suppress(OSError, ValueError):
            resource.prlimit(proc.pid, resource.RLIMIT_AS, (_HARNESS_CAP_BYTES, _HARNESS_CAP_BYTES))
        tail = _LogTail(log)
        try:
            found_now, stopped = self._watch(proc, tail, deadline)
            tail.poll()
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            self._account(tail, spawned)
        return proc.returncode, found_now, stopped

    def _watch(
        self, proc: subprocess.Popen[bytes], tail: _LogTail, deadline: float
    ) -> tuple[bool, bool]:
        """Follow one process until it exits or is stopped; (saved an artifact, stopped)."""
        found_now = False
        interrupted_at: float | None = None
        while True:
            exited = proc.poll() is not None
            tail.poll()
            found_now |= self._poll(tail)
            if exited:
                return found_now, False
            if (self.hooks.stop_on_first and found_now) or self.hooks.stop_now():
                _kill_group(proc)
                return found_now, True
            mono = time.monotonic()
            if mono > deadline and interrupted_at is None:
                # libFuzzer's own clock started after the harness's start-up; SIGINT makes it
                # print its final stats and exit now.
                interrupted_at = mono
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGINT)
            elif interrupted_at is not None and mono > interrupted_at + _GRACE_S:
                _kill_group(proc)
                return found_now, False
            time.sleep(_TICK_S)

    def _poll(self, tail: _LogTail) -> bool:
        """Take in the events, the new artifacts and the counters; True for a new artifact."""
        run, now = self.run, self.elapsed()
        for _, kind, value in self.events.poll():
            if kind == "best":
                with contextlib.suppress(ValueError):
                    run.best_cost_over_time.append((now, float(value)))
        found = False
        for path in sorted(self.artifacts.iterdir()):
            if path.name in self.seen or not path.name.startswith(_ARTIFACT_KINDS):
                continue
            self.seen.add(path.name)
            run.artifacts.append(path)
            found = True
            if self.hooks.on_artifact is not None:
                self.hooks.on_artifact(path, now)
        run.coverage = tail.cov if tail.cov is not None else run.coverage
        run.features = tail.ft if tail.ft is not None else run.features
        if self.hooks.on_tick is not None:
            self.hooks.on_tick(self._so_far(tail, now), now)
        return found

    def _so_far(self, tail: _LogTail, now: float) -> LibFuzzerRun:
        """The run as it stands, the running process's counters included."""
        run = self.run
        probe = LibFuzzerRun(mode=self.mode, execs=run.execs + tail.total_execs())
        probe.coverage, probe.wall_s = run.coverage, now
        running = time.monotonic() - tail.started_at if tail.started_at else 0.0
        probe.fuzz_s = run.fuzz_s + running
        probe.best_cost_over_time = run.best_cost_over_time
        probe.artifacts = run.artifacts
        return probe

    def _account(self, tail: _LogTail, spawned: float) -> None:
        """Add an ended process's executions and its fuzzing and start-up time."""
        run = self.run
        run.execs += tail.total_execs()
        ended = time.monotonic()
        if tail.started_at is not None:
            run.fuzz_s += ended - tail.started_at
            run.startup_s += tail.started_at - spawned
        else:
            run.startup_s += ended - spawned
        tail.close()


def run_atheris(
    target_name: str,
    *,
    mode: AtherisMode = "cost",
    duration_s: float = 60.0,
    jobs: int = 1,
    out_dir: Path,
    seed: int = 0,
    stop_on_first: bool = False,
    dictionary: bool = True,
    extra_flags: Sequence[str] = (),
    budgets: Budgets | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_exit: Callable[[], None] | None = None,
    on_tick: Callable[[LibFuzzerRun, float], None] | None = None,
    on_artifact: Callable[[Path, float], None] | None = None,
) -> LibFuzzerRun:
    """Run libFuzzer on ``target_name`` for ``duration_s`` (subprocesses, see module doc).

    Artifacts (``crash-*``, ``timeout-*``, ``oom-*``) land in ``out_dir/artifacts``; the working
    corpus in ``out_dir/corpus`` (seeded with the target's seeds; ``payloads/corpus/<target>/``
    is read too). ``stop_on_first``: end at the first artifact (what time-to-first-finding
    measures). ``budgets`` overrides the target's inside the harness. ``should_stop()`` is
    polled with the ticks and after each libFuzzer process ends: True ends the run (the engine
    stops at the first *confirmed* finding this way); ``on_exit()`` is called when a libFuzzer
    process ends, before that decision (the engine waits there for its artifacts to be
    confirmed). ``on_tick(run, elapsed)`` is called about ten times a second;
    ``on_artifact(path, elapsed)`` once per new artifact.
    """
    from fuzz.targets import get_target

    target = get_target(target_name)
    work = Path(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-artifact_prefix={work / 'artifacts'}/",
        "-print_final_stats=1",
        f"-seed={seed + 1}",  # 0 would mean "random"
    ]
    if dictionary and target.dictionary():
        flags.append(f"-dict={_dictionary_for(target, work)}")
    if jobs > 1:
        flags += [f"-fork={jobs}", "-ignore_crashes=1", "-ignore_timeouts=1", "-ignore_ooms=1"]
    flags += list(extra_flags)
    hooks = _Hooks(stop_on_first, should_stop, on_exit, on_tick, on_artifact)
    session = _Session(work, target, mode, hooks, flags)
    argv0 = _wrapper_script(work, target_name, mode, budgets)
    return session.go(argv0, session.started + duration_s)
