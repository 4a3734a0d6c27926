"""The run context every engine takes: its options, the events it reports, the findings it records.

A campaign (or a test, or a bench) makes one :class:`EngineRun` per engine and calls the engine
with it; the engine executes inputs and tells the run what happened (:meth:`EngineRun.executed`,
:meth:`EngineRun.record`), and the run keeps the counters, turns them into progress events and
into the :class:`EngineResult` the engine returns. The engines differ in how they search, not in
what they report or in what a finding goes through (:func:`fuzz.findings.record`: dedup, ddmin,
save).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuzz.findings import Finding, FindingSet, record

if TYPE_CHECKING:
    from fuzz.oracle import Oracle, Outcome
    from fuzz.targets import FuzzTarget

__all__ = ["EngineResult", "EngineRun", "Progress", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What an engine is asked to do.

    ``out_dir``: the engine's own working space (corpora, logs, example databases); None: a
    temporary one, or none. ``save_root``: the corpus root a finding is saved under, as
    ``<save_root>/found/<target>/<id>.yaml``; None: findings are not saved. ``stop_on_first``:
    end at the first finding (what the time to first finding measures). ``minimise_s``: the
    time ddmin gets per finding. ``max_execs``: end after about this many executions too (a
    count that means the same on a busy machine; the engine's batch may overshoot it).
    """

    duration_s: float
    jobs: int = 1
    out_dir: Path | None = None
    seed: int | None = None
    minimise_s: float = 20.0
    save_root: Path | None = None
    stop_on_first: bool = False
    max_execs: int | None = None


@dataclass(frozen=True)
class Progress:
    """A progress event from an engine (the campaign prints one line from it)."""

    elapsed_s: float
    execs: int
    execs_per_s: float
    coverage: int | None
    best_cost: float
    findings: int
    engine: str = ""


@dataclass
class EngineResult:
    """What an engine returns: ``best_cost_over_time`` is ``(seconds, Cost.scalar())`` at each
    improvement; ``coverage`` the edges or features seen (None when the engine has none)."""

    execs: int
    findings: list[Finding]
    best_cost_over_time: list[tuple[float, float]]
    coverage: int | None
    time_to_first_finding_s: float | None
    engine: str = ""
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class EngineRun:
    """One engine's run on one target. Safe to share between an engine's threads.

    ``findings`` is the campaign's deduplicating set (shared by its engines; a fresh one when
    not given); ``engine`` names the run in findings, events and the result (an engine fills in
    its own name when it is empty); ``on_progress`` receives the events.
    """

    def __init__(
        self,
        target: FuzzTarget,
        oracle_factory: Callable[[], Oracle],
        options: RunOptions,
        *,
        engine: str = "",
        findings: FindingSet | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.target = target
        self.oracle_factory = oracle_factory
        self.options = options
        self.engine = engine
        self.findings = findings if findings is not None else FindingSet()
        self.on_progress = on_progress
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.deadline = self.started + options.duration_s
        self.execs = 0
        self.coverage: int | None = None
        self.best = 0.0
        self.best_over_time: list[tuple[float, float]] = []
        self.first_finding_s: float | None = None
        self.found: list[Finding] = []  # recorded by this run (not by other engines)
        self.errors: list[str] = []
        self._reported_at = float("-inf")

    # ------------------------------------------------------------------------------ clock

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def over(self) -> bool:
        """Whether the run's duration (or its count of executions) is spent."""
        limit = self.options.max_execs
        return time.monotonic() >= self.deadline or (limit is not None and self.execs >= limit)

    # ----------------------------------------------------------------------------- events

    def executed(self, outcome: Outcome) -> float:
        """Count one execution and climb the best cost; returns the run's elapsed seconds."""
        with self.lock:
            self.execs += 1
            return self._climb(outcome.cost.scalar())

    def climbed(self, scalar: float, at: float | None = None) -> None:
        """A cost measured elsewhere (the atheris harness reports only its improvements)."""
        with self.lock:
            self._climb(scalar, at)

    def _climb(self, scalar: float, at: float | None = None) -> float:
        now = self.elapsed() if at is None else at
        if scalar > self.best:
            self.best = scalar
            self.best_over_time.append((now, scalar))
        return now

    def error(self, exc: BaseException) -> None:
        """A harness error (not a finding): reported in the result, the campaign goes on."""
        with self.lock:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:500])

    def report(self, *, every_s: float = 0.0, execs_per_s: float | None = None) -> None:
        """Send a progress event, at most one per ``every_s`` seconds. ``execs_per_s``: the
        engine's own rate (atheris leaves out its start-up), else execs over elapsed time."""
        if self.on_progress is None:
            return
        with self.lock:
            now = self.elapsed()
            if now - self._reported_at < every_s:
                return
            self._reported_at = now
            rate = execs_per_s if execs_per_s is not None else self.execs / now if now > 0 else 0.0
            event = Progress(
                elapsed_s=now,
                execs=self.execs,
                execs_per_s=rate,
                coverage=self.coverage,
                best_cost=self.best,
                findings=len(self.found),
                engine=self.engine,
            )
        self.on_progress(event)

    # --------------------------------------------------------------------------- findings

    def record(
        self, data: bytes, outcome: Outcome, oracle: Oracle, *, at: float | None = None
    ) -> Finding | None:
        """A finding ``oracle`` reported for ``data`` (``at`` seconds into the run): counted
        for the time to the first finding, then deduplicated, minimised and saved as the
        options say. None when its cause is known already (or did not reproduce)."""
        now = self.elapsed() if at is None else at
        with self.lock:
            if self.first_finding_s is None or now < self.first_finding_s:
                self.first_finding_s = now
        opts = self.options
        found = record(
            self.target,
            data,
            outcome,
            self.engine,
            oracle=oracle,
            seen=self.findings,
            found_after_s=now,
            seed=opts.seed,
            minimise_s=opts.minimise_s,
            save_root=opts.save_root,
        )
        if found is not None:
            with self.lock:
                self.found.append(found)
        return found

    def add(self, finding: Finding, *, at: float) -> None:
        """A finding recorded outside :meth:`record` (a live campaign confirms and minimises
        against the server itself, :mod:`fuzz.live`), seen ``at`` seconds into the run."""
        with self.lock:
            if self.first_finding_s is None or at < self.first_finding_s:
                self.first_finding_s = at
            self.found.append(finding)

    # ----------------------------------------------------------------------------- result

    def result(
        self,
        *,
        closing_point: bool = True,
        duration_s: float | None = None,
        **extra: Any,
    ) -> EngineResult:
        """The engine's result; ``extra`` goes to ``EngineResult.extra`` with the errors.
        ``closing_point`` adds ``(now, best)`` so a plot runs to the end of the run."""
        with self.lock:
            now = self.elapsed()
            curve = list(self.best_over_time)
            if closing_point:
                curve.append((now, self.best))
            return EngineResult(
                execs=self.execs,
                findings=list(self.found),
                best_cost_over_time=curve,
                coverage=self.coverage,
                time_to_first_finding_s=self.first_finding_s,
                engine=self.engine,
                duration_s=now if duration_s is None else duration_s,
                extra={**extra, "errors": list(self.errors)},
            )
