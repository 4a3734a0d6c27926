"""The atheris engine: libFuzzer's coverage to explore, the oracle's cost to climb.

Three parts, one module each: the harness that runs inside the libFuzzer process (instrumented
imports, cost fed back as coverage, structure-aware mutation: :mod:`fuzz.engines.atheris_harness`),
the libFuzzer processes the engine starts and watches (:mod:`fuzz.engines._libfuzzer`), and
this module, the engine: every artifact libFuzzer saves is replayed through the oracle, and a
confirmed finding is recorded in the run (dedup, ddmin, save) in a background thread while
libFuzzer goes on. One the oracle does not confirm (a backstop fired on a noisy input) is
counted in ``extra["unconfirmed"]``.
"""

from __future__ import annotations

import contextlib
import queue
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from fuzz._exceptions import EngineUnavailable
from fuzz.engines._libfuzzer import LibFuzzerRun, run_atheris
from fuzz.engines.atheris_harness import AtherisMode

if TYPE_CHECKING:
    from fuzz.engines._run import EngineResult, EngineRun
    from fuzz.oracle import Oracle
    from fuzz.targets import Budgets

__all__ = ["INSTALL_HINT", "NAME", "atheris_available", "engine_available", "run_engine"]

NAME = "atheris"
INSTALL_HINT = "Install it with: pip install 'schedguard[fuzz]' (atheris has Linux wheels only)."
_PROGRESS_EVERY_S = 0.5


def atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


engine_available = atheris_available


class _Triage:
    """Replays each artifact through the oracle in a background thread and records the ones
    it confirms; the oracle is made on the first artifact, in that thread."""

    def __init__(self, run: EngineRun) -> None:
        self.run = run
        self.todo: queue.Queue[tuple[Path, float] | None] = queue.Queue()
        self.confirmed_at: list[float] = []
        self.unconfirmed: list[str] = []
        self._oracle: Oracle | None = None
        self._thread = threading.Thread(target=self._loop, name="atheris-triage", daemon=True)
        self._thread.start()

    def put(self, path: Path, at: float) -> None:
        self.todo.put((path, at))

    def close(self) -> None:
        self.todo.put(None)
        self._thread.join()

    def _loop(self) -> None:
        try:
            while (item := self.todo.get()) is not None:
                try:
                    self._one(*item)
                except Exception as exc:  # report it; never hang the campaign
                    self.run.error(exc)
                finally:
                    self.todo.task_done()
            self.todo.task_done()
        finally:
            if self._oracle is not None:
                self._oracle.close()

    def _one(self, path: Path, at: float) -> None:
        data = path.read_bytes()
        if self._oracle is None:
            self._oracle = self.run.oracle_factory()
        outcome = self._oracle.run(data)
        if not outcome.is_finding:
            with self.run.lock:
                self.unconfirmed.append(path.name)
            return
        with self.run.lock:
            self.confirmed_at.append(at)
        self.run.record(data, outcome, self._oracle, at=at)


@contextlib.contextmanager
def _work_dir(run: EngineRun) -> Iterator[tuple[Path, bool]]:
    """The engine's directory under the run's ``out_dir``, or a temporary one (then True)."""
    out_dir = run.options.out_dir
    if out_dir is not None:
        yield Path(out_dir) / run.engine, False
        return
    with tempfile.TemporaryDirectory(prefix="schedguard-atheris-") as scratch:
        yield Path(scratch), True


def run_engine(
    run: EngineRun,
    *,
    mode: AtherisMode = "cost",
    budgets: Budgets | None = None,
    dictionary: bool = True,
) -> EngineResult:
    """The ``atheris`` engine (see the module docstring); ``mode="coverage"`` with
    ``dictionary=False`` is plain atheris, the baseline of ``bench/fuzz.py``. ``budgets``
    overrides the target's inside the harness (the oracle keeps its own)."""
    if not atheris_available():
        raise EngineUnavailable(f"atheris is not installed. {INSTALL_HINT}")
    run.engine = run.engine or (NAME if mode == "cost" else f"{NAME}-{mode}")
    opts = run.options
    triage = _Triage(run)
    fed = [0]  # best-cost points of the harness passed on to the run so far

    def take(lf: LibFuzzerRun) -> None:
        for at, scalar in lf.best_cost_over_time[fed[0] :]:
            run.climbed(scalar, at)
        fed[0] = len(lf.best_cost_over_time)
        with run.lock:
            run.execs, run.coverage = lf.execs, lf.coverage

    def on_tick(lf: LibFuzzerRun, elapsed: float) -> None:
        take(lf)
        run.report(every_s=_PROGRESS_EVERY_S, execs_per_s=lf.execs_per_s)

    with _work_dir(run) as (work, temporary):
        try:
            lf = run_atheris(
                run.target.name,
                mode=mode,
                duration_s=opts.duration_s,
                jobs=opts.jobs,
                out_dir=work,
                seed=0 if opts.seed is None else opts.seed,
                budgets=budgets,
                dictionary=dictionary,
                # Stop at the first finding the oracle confirms (not at an unconfirmed artifact),
                # or once max_execs are done (libFuzzer's -runs ends each process there).
                extra_flags=() if opts.max_execs is None else (f"-runs={opts.max_execs}",),
                should_stop=lambda: (
                    (opts.stop_on_first and bool(triage.confirmed_at))
                    or (opts.max_execs is not None and run.execs >= opts.max_execs)
                ),
                on_exit=triage.todo.join if opts.stop_on_first else None,
                on_tick=on_tick,
                on_artifact=triage.put,
            )
        finally:
            triage.close()
    take(lf)
    return run.result(
        closing_point=False,
        duration_s=lf.wall_s,
        mode=mode,
        coverage_kind="libFuzzer cov (edges); features in 'features'",
        features=lf.features,
        execs_per_s=round(lf.execs_per_s, 1),
        startup_s=round(lf.startup_s, 2),
        restarts=lf.restarts,
        artifacts=[p.name for p in lf.artifacts],
        unconfirmed=list(triage.unconfirmed),
        log=str(lf.log_path) if lf.log_path and not temporary else None,
    )
