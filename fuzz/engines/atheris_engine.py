"""The atheris (libFuzzer) engine: coverage to explore, the oracle's cost to climb.

libFuzzer runs in-process and ends with ``sys.exit``, so every run is a subprocess::

    python -m fuzz.engines.atheris_engine --target NAME --mode cost -- <libFuzzer flags> <dirs>

The harness (:func:`harness_main`, also what ``.clusterfuzzlite/`` builds) imports the target's
packages under ``atheris.instrument_imports`` and warms the target up there, so lazily imported
modules are instrumented too. Three modes:

``cost`` (the engine)
    Each input is measured as the oracle measures it (:func:`fuzz._worker.execute_one`: CPU
    timer at the wall budget, peak RSS growth, the target's step and token counters) and
    classified against the budgets (:func:`fuzz.oracle.classify`). A finding is raised as an
    exception, so libFuzzer saves a ``crash-*`` file. The measured cost is also *fed back as
    coverage*: each cost family (steps, tokens, CPU time, memory, cost per byte) owns a row of
    extra counters, one per x1.5 bucket, and an input that reaches a bucket not seen before is
    "new coverage" that libFuzzer keeps and mutates further. That turns libFuzzer's
    keep-what-is-new loop into a hill climb on cost (PerfFuzz's idea, within libFuzzer's
    feature model). libFuzzer schedules its corpus by feature rarity, not cost, so the harness
    also keeps the costliest inputs seen (:class:`_Elite`) and the custom mutator spends a third
    of its mutations on them. Mutation is structure-aware: the target's own ``mutate`` (nest,
    repeat, grow numbers, JSON edits) with libFuzzer's ``Mutate`` (and the dictionary) as the
    fallback.
``coverage`` (the baseline)
    Plain atheris: no cost measurement, no custom mutator; only exceptions, libFuzzer's
    ``-timeout`` and ``-rss_limit_mb`` (set from the same budgets) find anything.
``hypothesis``
    atheris drives the target's Hypothesis property through ``fuzz_one_input``: libFuzzer's
    bytes become the property's choice sequence, so inputs come from the grammar strategies.

Backstops: ``RLIMIT_AS`` in the harness (baseline + ``max(2 * mem budget, 256 MiB)``, as the
oracle's worker), ``-rss_limit_mb`` and ``-timeout`` from the budgets, and the parent's wall
clock, which kills the harness's process group. ``jobs > 1`` uses libFuzzer's fork mode (one
child per core, crashes, timeouts and OOMs ignored so the campaign goes on); with one job a
crash ends the libFuzzer run and the engine restarts it on the same corpus.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import resource
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

if TYPE_CHECKING:
    from fuzz.findings import EngineResult, Finding, FindingSet, Progress
    from fuzz.oracle import Oracle, Outcome
    from fuzz.targets._base import Budgets, Cost, Target

__all__ = [
    "INSTRUMENTED_PACKAGES",
    "MODES",
    "AtherisRun",
    "CostFinding",
    "Mode",
    "atheris_available",
    "dictionary_text",
    "harness_main",
    "run_atheris",
    "run_engine",
    "seed_corpus_dir",
    "write_dictionary",
]

Mode = Literal["cost", "coverage", "hypothesis"]
MODES: tuple[Mode, ...] = ("cost", "coverage", "hypothesis")
# Packages whose code the targets run: instrumented for coverage. Not the web framework (the
# guard-app target's coverage that matters is the guard's), which would halve its execs/s.
INSTRUMENTED_PACKAGES: tuple[str, ...] = (
    "guard",
    "scheduler_ref",
    "jinja2",
    "markupsafe",
    "fuzz.targets",
)
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS_ROOT = PROJECT_ROOT / "payloads" / "corpus"
DICTIONARY_DIR = PROJECT_ROOT / "fuzz" / "dictionaries"
EVENTS_ENV = "SCHEDGUARD_ATHERIS_EVENTS"
_MIB = 1 << 20
_HARNESS_CAP_BYTES = 4 << 30  # outer RLIMIT_AS until the harness sets its own, tighter one
_ARTIFACT_KINDS = ("crash-", "timeout-", "oom-")
_GRACE_S = 3.0  # after SIGINT at the deadline, before SIGKILL


INSTALL_HINT = "Install it with: pip install 'schedguard[fuzz]' (atheris has Linux wheels only)."


def atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


engine_available = atheris_available


# ============================================================================ harness side


class CostFinding(Exception):
    """Raised inside the harness for an input the oracle calls a finding, so that libFuzzer
    saves it as a ``crash-*`` artifact. The message names the verdict, cause and cost."""


class _CostFeedback:
    """Extra libFuzzer counters, one row per cost family and one counter per x1.5 bucket."""

    BUCKETS = 48
    RATIO = math.log(1.5)
    # (family, smallest value worth a bucket): below it everything is bucket 0 (no signal),
    # so timer noise on trivial inputs does not look like progress.
    FLOORS: tuple[tuple[str, float], ...] = (
        ("steps", 8.0),
        ("tokens", 8.0),
        ("cpu_s", 2e-4),
        ("mem", float(_MIB)),
        ("per_byte", 0.01),
    )

    def __init__(self, atheris: Any) -> None:
        self._trace: Callable[[int], None] = atheris._trace_branch
        self._rows = [
            [atheris._reserve_counter() for _ in range(self.BUCKETS)] for _ in self.FLOORS
        ]

    def bucket(self, value: float, floor: float) -> int:
        if value < floor:
            return 0
        # The epsilon keeps exact powers of the ratio in their own bucket despite rounding.
        return min(self.BUCKETS - 1, 1 + int(math.log(value / floor) / self.RATIO + 1e-9))

    def feed(self, cost: Cost, size: int) -> None:
        values = (
            float(cost.steps),
            float(cost.output_tokens),
            cost.cpu_s or cost.time_s,
            float(cost.peak_mem_bytes),
            cost.per_byte(size),
        )
        for row, (_, floor), value in zip(self._rows, self.FLOORS, values, strict=True):
            b = self.bucket(value, floor)
            if b:
                self._trace(row[b])


class _Events:
    """Appends ``epoch kind value`` lines for the parent (works across fork-mode children)."""

    def __init__(self, path: str | None) -> None:
        self._fd = -1
        if path:
            with contextlib.suppress(OSError):
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.best = 0.0

    def cost(self, scalar: float) -> None:
        if scalar > self.best * 1.05 and scalar > 0:
            self.best = scalar
            self._write(f"{time.time():.3f} best {scalar:.6f}\n")

    def finding(self, outcome: Outcome) -> None:
        self._write(f"{time.time():.3f} finding {outcome.cause}\n")

    def _write(self, line: str) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fd, line.encode())


def _raise_soft_timeout(signum: int, frame: FrameType | None) -> None:
    from fuzz._worker import SoftTimeout

    raise SoftTimeout


def _flag(argv: Sequence[str], name: str) -> str | None:
    prefix = f"-{name}="
    for arg in argv:
        if arg.startswith(prefix):
            return arg[len(prefix) :]
    return None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _vm_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _headroom(budgets: Budgets) -> int:
    return max(2 * budgets.mem_bytes, 256 * _MIB)


def _with_defaults(argv: list[str], target: Target, budgets: Budgets, mode: Mode) -> list[str]:
    """Add the budget-derived libFuzzer flags the caller did not set (ClusterFuzzLite sets its
    own ``-timeout`` / ``-rss_limit_mb``; those stay)."""
    b = budgets
    extra: list[str] = []
    if _flag(argv, "timeout") is None:
        # cost mode classifies time itself (CPU timer at the budget); -timeout is the hard kill,
        # as the oracle's. The baseline has only libFuzzer's timer: the budget itself.
        seconds = 2 * b.wall_s + 1 if mode != "coverage" else b.wall_s
        extra.append(f"-timeout={max(1, math.ceil(seconds))}")
    if _flag(argv, "rss_limit_mb") is None:
        grow = _headroom(b) if mode != "coverage" else b.mem_bytes
        extra.append(f"-rss_limit_mb={(_rss_bytes() + grow) // _MIB + 1}")
    if _flag(argv, "max_len") is None:
        extra.append(f"-max_len={int(getattr(target, 'max_size', 4096))}")
    # Flags go before the corpus directories (libFuzzer reads flags anywhere, but keep order).
    return [argv[0], *extra, *argv[1:]]


def _limit_address_space(budgets: Budgets) -> None:
    limit = _vm_bytes() + _headroom(budgets)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _load_target(atheris: Any, target_name: str) -> Target:
    """Import the registry and warm the target up while imports are being instrumented."""
    with atheris.instrument_imports(include=list(INSTRUMENTED_PACKAGES)):
        from fuzz.targets import get_target

        target = get_target(target_name)
        warmup = getattr(target, "warmup", None)
        if warmup is not None:
            warmup()
        for seed in target.seeds():
            with contextlib.suppress(Exception):
                target.execute(seed)
    return target


class _Elite:
    """The costliest inputs seen (top by ``Cost.scalar()`` and top by cost per byte), for the
    custom mutator to mutate: PerfFuzz's queue of cost maximisers inside libFuzzer, whose own
    corpus only keeps an input for a *new* feature and schedules by rarity, not by cost."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.by_cost: list[tuple[float, bytes]] = []
        self.by_per_byte: list[tuple[float, bytes]] = []

    def offer(self, data: bytes, cost: Cost) -> None:
        self._offer(self.by_cost, cost.scalar(), data)
        self._offer(self.by_per_byte, cost.per_byte(len(data)), data)

    def _offer(self, top: list[tuple[float, bytes]], score: float, data: bytes) -> None:
        if len(top) >= self.size and score <= top[-1][0]:
            return
        if any(d == data for _, d in top):
            return
        top.append((score, data))
        top.sort(key=lambda e: -e[0])
        del top[self.size :]

    def pick(self, rng: random.Random) -> bytes | None:
        top = self.by_cost if rng.random() < 0.6 else self.by_per_byte
        if not top:
            return None
        # Rank-biased: the costliest is picked most often.
        return top[min(int(rng.expovariate(0.5)), len(top) - 1)][1]


def _cost_test(
    target: Target, budgets: Budgets, atheris: Any, events: _Events, elite: _Elite
) -> Callable[[bytes], None]:
    from fuzz._worker import MemProbe, execute_one
    from fuzz.oracle import classify

    probe = MemProbe()
    feedback = _CostFeedback(atheris)
    signal.signal(signal.SIGPROF, _raise_soft_timeout)

    def test_one_input(data: bytes) -> None:
        raw = execute_one(target, data, probe, budgets.wall_s)
        outcome = classify(raw, budgets, len(data))
        feedback.feed(outcome.cost, len(data))
        events.cost(outcome.cost.scalar())
        elite.offer(data, outcome.cost)
        if outcome.is_finding:
            events.finding(outcome)
            raise CostFinding(
                f"{outcome.cause} cost={outcome.cost.to_dict()} "
                f"{outcome.error_type or ''}: {(outcome.error_message or '')[:200]}"
            )

    return test_one_input


def _coverage_test(target: Target) -> Callable[[bytes], None]:
    expected = target.expected

    def test_one_input(data: bytes) -> None:
        try:  # noqa: SIM105 (a try costs less than a context manager on the hot path)
            target.execute(data)
        except expected:
            pass

    return test_one_input


def _mutator(
    target: Target, atheris: Any, elite: _Elite | None
) -> Callable[[bytes, int, int], bytes]:
    """Structure-aware mutation: a third of the time a stack of the target's own mutations of
    one of the costliest inputs, else the target's mutation of libFuzzer's pick, and libFuzzer's
    byte-level ``Mutate`` (with the dictionary) as the fallback."""

    def structured(data: bytes, max_size: int, rng: random.Random, depth: int) -> bytes:
        out = data
        for _ in range(depth):
            try:
                out = target.mutate(out, max_size, rng)
            except Exception:
                break
        return out[:max_size]

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        r = rng.random()
        if elite is not None and r < 0.35:
            parent = elite.pick(rng)
            if parent is not None:
                out = structured(parent, max_size, rng, 1 + int(rng.expovariate(1.0)))
                if out != parent:
                    return out
        if r < 0.75:
            out = structured(data, max_size, rng, 1)
            if out != data:
                return out
        mutated: bytes = atheris.Mutate(data, max_size)
        return mutated

    return custom_mutator


def harness_main(
    target_name: str,
    argv: Sequence[str] | None = None,
    *,
    mode: Mode = "cost",
    budgets: Budgets | None = None,
) -> NoReturn:
    """Fuzz ``target_name`` with atheris in this process (never returns: libFuzzer exits).

    ``argv``: ``[argv0, libFuzzer flags..., corpus dirs...]`` (default ``sys.argv``); argv0 must
    be executable for fork mode. Budget-derived flags are added when absent. ``budgets``
    overrides the target's (tests use an easy one).
    """
    import atheris

    args = list(sys.argv if argv is None else argv)
    target = _load_target(atheris, target_name)
    b = target.budgets if budgets is None else budgets
    forking = any(_flag(args, f) not in (None, "0") for f in ("fork", "jobs", "workers"))
    args = _with_defaults(args, target, b, mode)
    events = _Events(os.environ.get(EVENTS_ENV))
    kwargs: dict[str, Any] = {}
    if mode == "cost":
        elite = _Elite()
        test = _cost_test(target, b, atheris, events, elite)
        kwargs["custom_mutator"] = _mutator(target, atheris, elite)
    elif mode == "coverage":
        test = _coverage_test(target)
    else:
        from fuzz.engines.hypothesis_engine import fuzz_one_input_for

        test = fuzz_one_input_for(target, events=events, budgets=b)
    if not forking:  # the fork-mode parent only dispatches; its children limit themselves
        _limit_address_space(b)
    atheris.Setup(args, test, **kwargs)
    atheris.Fuzz()
    raise SystemExit(0)  # not reached: libFuzzer exits


# ============================================================================= parent side


def dictionary_text(target: Target) -> str:
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


def write_dictionary(target: Target, directory: Path = DICTIONARY_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{target.name}.dict"
    text = dictionary_text(target)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def seed_corpus_dir(target: Target, root: Path = CORPUS_ROOT) -> Path:
    """``payloads/corpus/<target>/``, holding at least the target's trivial seeds (one file
    each, named by content hash as libFuzzer names its units)."""
    import hashlib

    directory = root / target.name
    directory.mkdir(parents=True, exist_ok=True)
    for seed in target.seeds():
        path = directory / hashlib.sha1(seed).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
    return directory


@dataclass
class AtherisRun:
    """What one engine run saw (summed over libFuzzer restarts)."""

    mode: Mode
    execs: int = 0
    wall_s: float = 0.0
    coverage: int | None = None
    features: int | None = None
    artifacts: list[Path] = field(default_factory=list)
    artifact_times_s: list[float] = field(default_factory=list)
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

    @property
    def time_to_first_artifact_s(self) -> float | None:
        return min(self.artifact_times_s) if self.artifact_times_s else None


# "#4096 pulse cov: 83 ft: 120 corp: 9/130b lim: 43 exec/s: 2048 rss: 61Mb" and fork mode's
# "#20000: cov: 83 ft: 120 corp: 9 exec/s 1000 oom/timeout/crash: 0/0/1 time: 9s job: 2 ..."
_STATUS = re.compile(rb"^#(\d+):?\s+(?:[A-Z]+\s+)?cov: (\d+) ft: (\d+)")
_DONE = re.compile(rb"^Done (\d+) runs in")
_FINAL_EXECS = re.compile(rb"^stat::number_of_executed_units: (\d+)")


class _LogTail:
    """Reads a growing log file line by line and keeps the latest libFuzzer counters."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")
        self._partial = b""
        self.execs = 0
        self.cov: int | None = None
        self.ft: int | None = None
        self.final: int | None = None
        # When libFuzzer's loop began (its first status line): startup (imports, instrumentation,
        # warm-up) is not fuzzing time.
        self.started_at: float | None = None

    def poll(self) -> None:
        chunk = self._f.read()
        if not chunk:
            return
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
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

    def close(self) -> None:
        self._f.close()


class _EventTail:
    def __init__(self, path: Path) -> None:
        path.touch()
        self._f = path.open("rb")
        self._partial = b""

    def poll(self) -> list[tuple[float, str, str]]:
        chunk = self._f.read()
        if not chunk:
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            parts = line.decode("utf-8", "replace").split(" ", 2)
            if len(parts) == 3:
                with contextlib.suppress(ValueError):
                    out.append((float(parts[0]), parts[1], parts[2]))
        return out

    def close(self) -> None:
        self._f.close()


def _wrapper_script(
    work: Path, target_name: str, mode: Mode, budgets: Budgets | None = None
) -> Path:
    """An executable argv0 for libFuzzer (fork mode re-runs argv[0] for each job)."""
    import json
    import shlex

    path = work / f"harness-{mode}.sh"
    extra = ""
    if budgets is not None:
        extra = f" --budgets {shlex.quote(json.dumps(budgets.to_dict()))}"
    path.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} -m fuzz.engines.atheris_engine "
        f'--target {shlex.quote(target_name)} --mode {mode}{extra} --argv0 "$0" -- "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def run_atheris(
    target_name: str,
    *,
    mode: Mode = "cost",
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
    on_tick: Callable[[AtherisRun, float], None] | None = None,
    on_artifact: Callable[[Path, float], None] | None = None,
) -> AtherisRun:
    """Run libFuzzer on ``target_name`` for ``duration_s`` (subprocesses, see module doc).

    Artifacts (``crash-*``, ``timeout-*``, ``oom-*``) land in ``out_dir/artifacts``; the working
    corpus in ``out_dir/corpus`` (seeded from ``payloads/corpus/<target>/``).
    ``stop_on_first``: end at the first artifact (what time-to-first-finding measures).
    ``budgets`` overrides the target's inside the harness. ``should_stop()`` is polled with the
    ticks and after each libFuzzer process ends: True ends the run (the engine stops at the
    first *confirmed* finding this way); ``on_exit()`` is called when a libFuzzer process ends,
    before that decision (the engine waits there for its artifacts to be confirmed).
    ``on_tick(run, elapsed)`` is called about ten times a second; ``on_artifact(path,
    elapsed)`` once per new artifact.
    """
    from fuzz.targets import get_target

    target = get_target(target_name)
    work = Path(out_dir)
    artifacts = work / "artifacts"
    corpus = work / "corpus"
    for d in (artifacts, corpus):
        d.mkdir(parents=True, exist_ok=True)
    seeds = seed_corpus_dir(target)
    argv0 = _wrapper_script(work, target_name, mode, budgets)
    flags = [
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
        f"-seed={seed + 1}",  # 0 would mean "random"
    ]
    if dictionary and target.dictionary():
        try:  # fuzz/dictionaries/<target>.dict, refreshed if stale (ClusterFuzzLite uses it too)
            dict_path = write_dictionary(target)
        except OSError:  # a read-only install
            dict_path = write_dictionary(target, work)
        flags.append(f"-dict={dict_path}")
    if jobs > 1:
        flags += [f"-fork={jobs}", "-ignore_crashes=1", "-ignore_timeouts=1", "-ignore_ooms=1"]
    flags += list(extra_flags)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    events_path = work / f"events-{mode}.log"
    env[EVENTS_ENV] = str(events_path)
    run = AtherisRun(mode=mode)
    events = _EventTail(events_path)
    seen: set[str] = {p.name for p in artifacts.iterdir()}
    started = time.monotonic()
    deadline = started + duration_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining < 1.0:
                break
            log = work / f"libfuzzer-{mode}-{run.restarts}.log"
            run.log_path = log
            cmd = [
                str(argv0),
                *flags,
                f"-max_total_time={max(1, int(remaining))}",
                str(corpus),
                str(seeds),
            ]
            with log.open("wb") as log_f:
                proc = subprocess.Popen(
                    cmd,
                    cwd=work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            spawned = time.monotonic()
            with contextlib.suppress(OSError, ValueError):
                resource.prlimit(
                    proc.pid, resource.RLIMIT_AS, (_HARNESS_CAP_BYTES, _HARNESS_CAP_BYTES)
                )
            tail = _LogTail(log)
            found_now = False
            stopped = False
            interrupted_at: float | None = None
            try:
                while True:
                    exited = proc.poll() is not None
                    tail.poll()
                    now = time.monotonic() - started
                    for kind, value in ((k, v) for _, k, v in events.poll()):
                        if kind == "best":
                            with contextlib.suppress(ValueError):
                                run.best_cost_over_time.append((now, float(value)))
                    for path in sorted(artifacts.iterdir()):
                        if path.name in seen or not path.name.startswith(_ARTIFACT_KINDS):
                            continue
                        seen.add(path.name)
                        run.artifacts.append(path)
                        run.artifact_times_s.append(now)
                        found_now = True
                        if on_artifact is not None:
                            on_artifact(path, now)
                    run.coverage = tail.cov if tail.cov is not None else run.coverage
                    run.features = tail.ft if tail.ft is not None else run.features
                    if on_tick is not None:
                        probe = AtherisRun(mode=mode, execs=run.execs + tail.total_execs())
                        probe.coverage, probe.wall_s = run.coverage, now
                        probe.fuzz_s = run.fuzz_s + (
                            time.monotonic() - tail.started_at if tail.started_at else 0.0
                        )
                        probe.best_cost_over_time = run.best_cost_over_time
                        probe.artifacts = run.artifacts
                        on_tick(probe, now)
                    if exited:
                        break
                    if (stop_on_first and found_now) or (should_stop and should_stop()):
                        _kill_group(proc)
                        stopped = True
                        break
                    mono = time.monotonic()
                    if mono > deadline and interrupted_at is None:
                        # libFuzzer's own clock started after the harness's start-up; SIGINT
                        # makes it print its final stats and exit now.
                        interrupted_at = mono
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(proc.pid, signal.SIGINT)
                    elif interrupted_at is not None and mono > interrupted_at + _GRACE_S:
                        _kill_group(proc)
                        break
                    time.sleep(0.1)
                tail.poll()
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
                run.execs += tail.total_execs()
                ended = time.monotonic()
                if tail.started_at is not None:
                    run.fuzz_s += ended - tail.started_at
                    run.startup_s += tail.started_at - spawned
                else:
                    run.startup_s += ended - spawned
                tail.close()
            if stopped or (stop_on_first and run.artifacts):
                break
            if on_exit is not None:
                on_exit()
            if should_stop is not None and should_stop():
                break
            if proc.returncode not in (0, None) and not found_now:
                # The harness failed without an artifact (import error, bad flag): no retry loop.
                break
            if time.monotonic() >= deadline - 1.0:
                break
            run.restarts += 1
    finally:
        events.close()
        run.wall_s = time.monotonic() - started
    return run


# ================================================================================== engine


def run_engine(
    target: Target,
    oracle_factory: Callable[[], Oracle],
    *,
    duration_s: float,
    jobs: int = 1,
    out_dir: Path | None = None,
    seed: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    findings: FindingSet | None = None,
    save_root: Path | None = None,
    save: bool = True,
    minimise_s: float = 20.0,
    mode: Mode = "cost",
    stop_on_first: bool = False,
    engine_name: str | None = None,
    budgets: Budgets | None = None,
    dictionary: bool = True,
    **_: Any,
) -> EngineResult:
    """The ``atheris`` engine (see the module docstring); ``mode="coverage"`` with
    ``dictionary=False`` is plain atheris, the baseline of ``bench/fuzz.py``.

    Each artifact libFuzzer saves is replayed through the oracle: a confirmed finding is
    recorded (:func:`fuzz.findings.record`: dedup, ddmin, save) in a background thread while
    libFuzzer goes on; one the oracle does not confirm (a backstop fired on a noisy input) is
    counted in ``extra["unconfirmed"]``.
    """
    import queue
    import tempfile
    import threading

    from fuzz.findings import EngineResult, FindingSet, Progress, record

    if not atheris_available():
        raise RuntimeError(f"atheris is not installed. {INSTALL_HINT}")
    name = engine_name or ("atheris" if mode == "cost" else f"atheris-{mode}")
    shared = findings if findings is not None else FindingSet()
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if out_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="schedguard-atheris-")
        work = Path(scratch.name)
    else:
        work = Path(out_dir) / name
    todo: queue.Queue[tuple[Path, float] | None] = queue.Queue()
    mine: list[Finding] = []
    confirmed_at: list[float] = []
    unconfirmed: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    oracles: list[Oracle] = []  # made on the first artifact, in the triage thread

    def triage() -> None:
        try:
            while (item := todo.get()) is not None:
                try:
                    triage_one(*item)
                except Exception as exc:  # report it; never hang the campaign
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                finally:
                    todo.task_done()
            todo.task_done()
        finally:
            for o in oracles:
                o.close()

    def triage_one(path: Path, at: float) -> None:
        data = path.read_bytes()
        if not oracles:
            oracles.append(oracle_factory())
        oracle = oracles[0]
        outcome = oracle.run(data)
        if not outcome.is_finding:
            with lock:
                unconfirmed.append(path.name)
            return
        with lock:
            confirmed_at.append(at)
        found = record(
            target,
            data,
            outcome,
            name,
            oracle=oracle,
            seen=shared,
            found_after_s=at,
            seed=seed,
            minimise_s=minimise_s,
            save_root=save_root,
            save=save,
        )
        if found is not None:
            with lock:
                mine.append(found)

    worker = threading.Thread(target=triage, name="atheris-triage", daemon=True)
    worker.start()
    last_report = [0.0]

    def on_tick(run: AtherisRun, elapsed: float) -> None:
        if on_progress is None or elapsed - last_report[0] < 0.5:
            return
        last_report[0] = elapsed
        best = max((c for _, c in run.best_cost_over_time), default=0.0)
        with lock:
            n = len(mine)
        on_progress(
            Progress(
                elapsed_s=elapsed,
                execs=run.execs,
                execs_per_s=run.execs_per_s,
                coverage=run.coverage,
                best_cost=best,
                findings=n,
                engine=name,
            )
        )

    try:
        run = run_atheris(
            target.name,
            mode=mode,
            duration_s=duration_s,
            jobs=jobs,
            out_dir=work,
            seed=0 if seed is None else seed,
            budgets=budgets,
            dictionary=dictionary,
            # Stop at the first finding the oracle confirms (not at an unconfirmed artifact).
            should_stop=(lambda: bool(confirmed_at)) if stop_on_first else None,
            on_exit=todo.join if stop_on_first else None,
            on_tick=on_tick,
            on_artifact=lambda path, at: todo.put((path, at)),
        )
    finally:
        todo.put(None)
        worker.join()
        if scratch is not None:
            scratch.cleanup()
    return EngineResult(
        execs=run.execs,
        findings=mine,
        best_cost_over_time=run.best_cost_over_time,
        coverage=run.coverage,
        time_to_first_finding_s=min(confirmed_at) if confirmed_at else None,
        engine=name,
        duration_s=run.wall_s,
        extra={
            "mode": mode,
            "coverage_kind": "libFuzzer cov (edges); features in 'features'",
            "features": run.features,
            "execs_per_s": round(run.execs_per_s, 1),
            "startup_s": round(run.startup_s, 2),
            "restarts": run.restarts,
            "artifacts": [p.name for p in run.artifacts],
            "unconfirmed": unconfirmed,
            "errors": errors,
            "log": str(run.log_path) if run.log_path and scratch is None else None,
        },
    )


# ================================================================================== entry


def _main(argv: Sequence[str]) -> NoReturn:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m fuzz.engines.atheris_engine",
        description="atheris harness for one fuzz target (libFuzzer flags after --)",
    )
    parser.add_argument("--target", required=True)
    parser.add_argument("--mode", choices=MODES, default="cost")
    parser.add_argument("--argv0", default=None, help="executable libFuzzer re-runs in fork mode")
    parser.add_argument("--budgets", default=None, help="JSON Budgets overriding the target's")
    parser.add_argument("libfuzzer", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    rest = ns.libfuzzer[1:] if ns.libfuzzer[:1] == ["--"] else ns.libfuzzer
    budgets = None
    if ns.budgets:
        import json

        from fuzz.targets._base import Budgets

        budgets = Budgets(**json.loads(ns.budgets))
    harness_main(ns.target, [ns.argv0 or sys.argv[0], *rest], mode=ns.mode, budgets=budgets)


if __name__ == "__main__":
    _main(sys.argv[1:])
